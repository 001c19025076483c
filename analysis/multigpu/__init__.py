"""Runs of several ranks: which traces are one job's ranks and their clocks aligned on the
collectives (making a run), and the `traceq comm`, `overlap` and `ranks` analyses."""
