"""The model pool of a sweep: one LLMPool for every cell, so that a model is loaded once, not once a cell."""
from .cells import model_options


class SharedPool:
    """One LLMPool for the whole sweep. A cell's `run_pool(args, ...)` calls this (args.pool) and gets a
    Borrowed view whose `with` does not close the engines; `close()` at the end of the sweep does.
    Each model's engine gets its [models] engine settings (tensor_parallel_size, quantization) as the
    LLMPool's model_options, unless the run's own kwargs (the sweep's flags) set them for every model.
    It plans the device for every model of the sweep at once (each sized as its settings make it); when
    they do not fit together, it plans the next cell's models only and reloads when a cell needs others
    (load_sweep puts the cells of one model set next to each other). A run with other pool kwargs gets
    a new pool."""

    def __init__(self, models, settings, factory=None):
        self.models, self.settings, self.factory = list(models), settings, factory
        self.pool, self.planned, self.next, self.kwargs = None, set(), [], None

    def __call__(self, backend, **kwargs):
        need = set(self.next)
        if self.pool is not None and (not need <= self.planned or (backend, kwargs) != self.kwargs):
            self.pool.close()
            self.pool = None
        if self.pool is None:
            from ..backends import LLMPool
            options = model_options(self.settings, backend, kwargs)
            self.pool = (self.factory or LLMPool)(backend, **kwargs, **({"model_options": options} if options else {}))
            self.kwargs = (backend, kwargs)
            try:
                self.pool.plan(self.models)
                self.planned = set(self.models)
            except ValueError:  # together they do not fit on the device
                self.pool.plan(list(need))
                self.planned = need
        return Borrowed(self.pool, self.settings)

    def llms(self):
        return self.pool.llms if self.pool is not None else []

    def close(self):
        if self.pool is not None:
            self.pool.close()
            self.pool = None


class Borrowed:
    """A cell's view of the shared pool: the models' chat_template_kwargs are set on the LLMs it hands out."""

    def __init__(self, pool, settings):
        self.pool, self.settings = pool, settings

    def plan(self, models, shares=None):  # planned once for the sweep
        return self.pool.shares

    def get(self, model=None):
        llm = self.pool.get(model)
        kwargs = self.settings.get(str(model), {}).get("chat_template_kwargs") if model is not None else None
        if kwargs:
            llm.chat_template_kwargs = dict(kwargs)
        return llm

    def __getattr__(self, name):  # check, llms: the pool's own
        return getattr(self.pool, name)

    def __enter__(self):
        from ..backends import PLACEMENT
        self._scope = PLACEMENT.set(self.pool.placement) if self.pool.placement is not None else None
        return self

    def __exit__(self, *exc):
        if self._scope is not None:
            from ..backends import PLACEMENT
            PLACEMENT.reset(self._scope)
