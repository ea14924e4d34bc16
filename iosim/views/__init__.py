"""Ways of looking at a run: its event trace in files (:mod:`~iosim.views.trace_io`), pictures and text
step-throughs (:mod:`~iosim.views.show`), and the replay of its computation through hardware-managed caches
(:mod:`~iosim.views.replay` derives the operand accesses, :mod:`~iosim.views.cache_sim` holds LRU, FIFO and OPT)."""
