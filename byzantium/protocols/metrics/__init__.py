"""The papers' metrics, in one place: SAC's and CP-WBFT's (sac.py: IAA, FAA, BFTI, RA, H-Majority, group
accuracies), round-robin's (rr.py: accuracy per configuration, final-speaker analyses, chunk texts), and
the intervals every report puts around them (intervals.py: Wilson, Newcombe, bootstrap over problems)."""
