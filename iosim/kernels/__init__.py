"""Anyone's attention kernel against iosim: its numerics against the float64 reference (:mod:`~iosim.kernels.check`,
``iosim.check``)."""
