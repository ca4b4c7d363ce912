"""The building blocks every model calls: paged attention, linear, norm, rotary embedding, MLP.

Each holds the choice between its torch formula and the compiled kernels; models hold only their
architecture (which blocks, in which order, with which weights)."""
