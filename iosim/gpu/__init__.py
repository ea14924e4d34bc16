"""iosim's own numba.cuda kernels from the host: launching them with tiles chosen from M as the simulator chooses
(:mod:`~iosim.gpu.launch`) and what ptxas says they use (:mod:`~iosim.gpu.resources`)."""
