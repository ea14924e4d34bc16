"""Kernels written for iosim to count (``iosim kernel``): each file defines its kernel(s) and a ``launch`` function.

A launcher takes the problem (``N``, ``d``, block sizes, ``causal``, ...: only the keywords it declares are passed),
builds the inputs, launches, and returns a dict of the arrays by name (Q, K, V, O, L, dO, dQ, ... as the model
names them) plus optional numbers (``scale``). Files in this folder import triton at their top: import them only in
a process where ``TRITON_INTERPRET=1`` was set first (``iosim.kernels.count_file`` does).
"""
