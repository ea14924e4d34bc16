"""The plumbing every room uses: errors, output paths, Numba's cache kept honest, the version."""
