"""``iosim check --kernel NAME``: a built-in GPU kernel against the float64 reference (CUDA simulator without a GPU)."""

from __future__ import annotations

from iosim.base.errors import InputError
from iosim.cli.options import FORMATS, add_yes, positive, seed


def add_arguments(p) -> None:
    p.add_argument("--kernel", required=True, help="one of: flash2, flash1, standard, square-tiling")
    p.add_argument("--quick", action="store_true", help="a few tiny shapes (under a minute on the CUDA simulator)")
    p.add_argument("--N", type=positive("--N"), nargs="+", help="sequence lengths (default 1 17 113 203 1023)")
    p.add_argument("--d", type=positive("--d"), nargs="+", help="head dimensions (default 16 59 64 128)")
    p.add_argument("--M", type=positive("--M"), help="shared memory per block in words (default: ~N/3 blocks)")
    p.add_argument("--tiling", choices=("fit", "paper"), default="fit", help="block-size rule (default fit)")
    p.add_argument("--heads", type=positive("--heads"), default=2, help="heads per batch (default 2)")
    p.add_argument("--seed", type=seed, default=0, help="random seed of the inputs (default 0)")
    p.add_argument("--format", choices=FORMATS, default="simple", help="table format")
    p.add_argument("--dtype", default="float32", help="float32 (default), float64, float16, bfloat16")
    p.add_argument("--layout", default="BHND", help="BHND (default; the kernels' layout) or BNHD")
    p.add_argument("--distribution", nargs="+", help="input distributions (default: all that apply)")
    add_yes(p, "a check")


def command(args) -> int:
    """Numerical check of a built-in GPU kernel; on a machine without a GPU it runs on the CUDA simulator, selected
    in this process before numba.cuda is imported (iosim.gpu.select_target). Exit code 1 when a check fails."""
    from iosim.gpu import launch as gpu
    from iosim.kernels.check import check as run_check
    from iosim.kernels.check import planned_cases, validate
    from iosim.runner import estimate

    validate(args.dtype, args.layout, args.distribution)
    if args.kernel not in gpu.KERNELS:
        raise InputError("--kernel", f"must be one of {', '.join(gpu.KERNELS)}", args.kernel)
    target = gpu.select_target()
    if target == "gpu" and not gpu.gpu_available():
        raise InputError("NUMBA_ENABLE_CUDASIM", "must be unset or 1 on a machine without a CUDA GPU", "0")
    if target == "simulator" and not args.quick and args.N is None:
        raise InputError(
            "--quick",
            "(or small --N and --d) is needed on the CUDA simulator: the full grid of shapes "
            "up to N=1023, d=128 takes hours without a GPU",
            "no --quick",
        )
    if target == "simulator":  # the long-run rule: the simulator runs a kernel on the CPU (estimate.SIMULATOR_N2D)
        cases = planned_cases(args.N, args.d, args.quick, args.distribution)
        backward = args.kernel in gpu.BACKWARD_KERNELS
        estimate.check(
            estimate.simulator_seconds(cases, args.heads, backward=backward),
            f"a check of {args.kernel} on the CUDA simulator ({len(cases)} cases, {args.heads} heads)",
            allow_long=args.yes,
            parameter="--N",
            value=args.N,
            remedy="use --quick or smaller --N, --d, --heads",
        )
    where = "the CUDA simulator (no GPU found)" if target == "simulator" else "the GPU"
    memory = f"M = {args.M} words" if args.M else "M chosen for about 3 blocks along N"
    print(f"iosim check: kernel {args.kernel} on {where}; shared memory per block: {memory}")
    fn = gpu.attention(args.kernel, args.M, tiling=args.tiling)
    report = run_check(
        fn,
        N=args.N,
        d=args.d,
        quick=args.quick,
        heads=args.heads,
        seed=args.seed,
        name=args.kernel,
        dtype=args.dtype,
        layout=args.layout,
        distributions=args.distribution,
    )
    print(report.table(args.format))
    print(report.summary())
    return 0 if report.passed else 1
