"""What the papers say, as code: exact closed-form counts of every schedule (:mod:`~iosim.theory.io_model`), the
papers' upper and lower bounds (:mod:`~iosim.theory.bounds`) and the block-size rules (:mod:`~iosim.theory.tiling`).
docs/theory.md states the same in prose, with sources."""
