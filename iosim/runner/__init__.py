"""How a run goes: the front door (run), problem runs, results, float64 references, the caller's
arrays, validation, estimates of long work, the algorithm registry, sweeps and the Numba warm-up."""
