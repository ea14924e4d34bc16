"""Which scores exist: mask kinds, mask_mod files, per-head masks, block-sparse and top-k indices."""
