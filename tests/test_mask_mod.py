"""FlexAttention's masks as iosim masks (iosim.masking.mask_mod, the MOD kind of iosim.algorithms.tile_masks): a
mask_mod
function and a BlockMask compile to a tile oracle that equals the mask's own N x N array on every rectangle, run on
every schedule and problem shape with counts equal to the closed form, and count exactly what the same mask given
as an N x N array counts (an independent path: the 2-D prefix-sum oracle). Bad input is one line."""

from __future__ import annotations

import itertools
import json
import pathlib

import numpy as np
import pytest
from iosim.algorithms import tile_masks as tm

import iosim
from iosim import Problem
from iosim.base.errors import InputError
from iosim.cli import main
from iosim.masking import mask_mod as mm
from iosim.masking import masks

torch = pytest.importorskip("torch")

DOC = np.repeat(np.arange(6), [50, 100, 7, 90, 60, 26])  # 333 tokens in 6 documents
TDOC = torch.from_numpy(DOC)


def doc_causal(b, h, q_idx, kv_idx):
    return (DOC[q_idx] == DOC[kv_idx]) & (q_idx >= kv_idx)


def doc_causal_torch(b, h, q_idx, kv_idx):
    return (TDOC[q_idx] == TDOC[kv_idx]) & (q_idx >= kv_idx)


def dense_of(fn, Nq, Nk, b=0, h=0):  # noqa: N803
    q, kv = np.arange(Nq)[:, None], np.arange(Nk)[None, :]
    return np.broadcast_to(np.asarray(fn(b, h, q, kv)), (Nq, Nk))


def _exact(r) -> bool:
    return all(ps.stats.per_array == ps.predicted.per_array and ps.stats.peak == ps.predicted.peak
               for ps in r.passes.values())  # fmt: skip


@pytest.mark.parametrize("N", [1, 63, 64, 65, 200, 333])
def test_oracle_equals_the_array_on_every_rectangle(N):
    """nnz of random rectangles, the row and column ranges, and the element test equal the mask_mod's array."""

    def fn(b, h, q, kv):
        return ((q * 7 + kv * 3) % 5 < 2) | (np.abs(q - kv) < 40) if N != 333 else doc_causal(b, h, q, kv)

    ref = dense_of(fn, N, N)
    m = masks.from_mask_mod(fn).compile(N)
    assert m.kind == tm.MOD and (m.dense() == ref).all() and m.nnz() == ref.sum()
    rng = np.random.default_rng(N)
    for _ in range(400):
        r0, c0 = rng.integers(0, N, 2)
        nr, nc = rng.integers(1, N - r0 + 1), rng.integers(1, N - c0 + 1)
        assert tm.mask_nnz(m.kind, m.params, m.table, r0, nr, c0, nc) == ref[r0 : r0 + nr, c0 : c0 + nc].sum()
        lo, hi = tm.mask_cols(m.kind, m.params, m.table, r0, nr, N)
        assert not ref[r0 : r0 + nr, :lo].any() and not ref[r0 : r0 + nr, hi:].any()
        lo, hi = tm.mask_rows(m.kind, m.params, m.table, c0, nc, N)
        assert not ref[:lo, c0 : c0 + nc].any() and not ref[hi:, c0 : c0 + nc].any()


def test_torch_and_numpy_mask_mods_agree():
    """A mask_mod written with torch (captured document ids as a tensor) is called with torch tensors."""
    a = masks.from_mask_mod(doc_causal).compile(333)
    b = masks.from_mask_mod(doc_causal_torch).compile(333)
    assert (a.table == b.table).all() and (a.params == b.params).all()


SHAPES = [(3, 29), (1, 40), (17, 40), (29, 29)]


def _case(Nk):  # noqa: N803
    doc = np.arange(Nk) * 3 // Nk

    def mod(b, h, q, kv):
        return ((doc[q] == doc[kv]) & (q >= kv)) | (kv < 2)

    return mod, dense_of(mod, Nk, Nk)


def _grid():
    schedules = [{}, {"splits": 3}, {"page_size": 6}, {"latent": True}]
    for algo, shape, gqa, sched in itertools.product(["flash1", "flash2"], SHAPES, ["per-head", "packed"], schedules):
        if not (algo == "flash1" and "splits" in sched):
            yield algo, shape, gqa, sched


@pytest.mark.parametrize("algo, shape, gqa, sched", list(_grid()))
def test_problem_counts_equal_closed_form_and_the_array_mask(algo, shape, gqa, sched):
    Nq, Nk = shape
    fn, ref = _case(Nk)
    latent = sched.get("latent", False)
    p = Problem(B=2, H_q=4, H_kv=1 if latent else 2, N_q=Nq, N_k=Nk, d_qk=6, d_v=5, latent=latent,
                page_size=sched.get("page_size"))  # fmt: skip
    kw = {"splits": sched["splits"]} if "splits" in sched else {}
    mod = masks.from_mask_mod(fn)
    for bwd in (False, True) if not sched else (False,):
        r = iosim.run(
            iosim.Schedule(algo, gqa=gqa, Br=4, Bc=5, **kw), problem=p, M=900, mask=mod, count_only=True, backward=bwd
        )
        a = iosim.run(
            iosim.Schedule(algo, gqa=gqa, Br=4, Bc=5, **kw), problem=p, M=900, mask=ref, count_only=True, backward=bwd
        )
        assert _exact(r)
        assert {k: v.stats.per_array for k, v in r.passes.items()} == {
            k: v.stats.per_array for k, v in a.passes.items()
        }


@pytest.mark.parametrize("algo", ["standard", "square-tiling", "flash1", "flash2"])
def test_numerics_and_one_head_algorithms(algo):
    """Outputs equal the float64 reference under the mask_mod; counts equal the closed form."""
    fn, _ = _case(29)
    p = Problem(B=1, H_q=2, H_kv=1, N_q=17, N_k=29, d_qk=6, d_v=5)
    r = iosim.run(algo, problem=p, M=900, mask=masks.from_mask_mod(fn), seed=1)
    assert _exact(r) and r.finite and max(r.errors.values()) < 1e-12
    one = iosim.run(algo, N=333, d=8, M=2048, mask=masks.from_mask_mod(doc_causal), seed=2)
    arr = iosim.run(algo, N=333, d=8, M=2048, mask=dense_of(doc_causal, 333, 333), seed=2)
    assert one.stats.per_array == arr.stats.per_array and one.stats.peak == arr.stats.peak
    assert max(one.errors.values()) < 1e-12


def test_block_mask_as_a_mask():
    """A BlockMask built on the CPU: its scores are its mask_mod's; its index tensors alone (no mask_mod) allow
    every position of a listed block; shapes that do not fit the problem are one line."""
    from torch.nn.attention.flex_attention import create_block_mask

    bm = create_block_mask(doc_causal_torch, None, None, 333, 333, device="cpu", BLOCK_SIZE=64)
    m = masks.from_block_mask(bm).compile(333)
    assert (m.dense() == dense_of(doc_causal, 333, 333)).all()
    raw = masks.from_block_mask(kv_num_blocks=bm.kv_num_blocks, kv_indices=bm.kv_indices,
                                full_kv_num_blocks=bm.full_kv_num_blocks, full_kv_indices=bm.full_kv_indices,
                                block_size=64).compile(333)  # fmt: skip
    blocks = dense_of(doc_causal, 333, 333).reshape(333, 1, 333)  # any allowed score in each 64 x 64 block
    want = np.zeros((333, 333), bool)
    for i in range(6):
        for j in range(6):
            want[i * 64 : (i + 1) * 64, j * 64 : (j + 1) * 64] = blocks[
                i * 64 : (i + 1) * 64, 0, j * 64 : (j + 1) * 64
            ].any()
    assert (raw.dense() == want).all()
    r = iosim.run("flash2", N=333, d=8, M=2048, mask=masks.from_block_mask(bm), count_only=True)
    arr = iosim.run("flash2", N=333, d=8, M=2048, mask=m.dense(), count_only=True)
    assert r.stats.per_array == arr.stats.per_array and _exact(r)
    with pytest.raises(InputError) as e:
        masks.from_block_mask(bm).compile(300)
    assert e.value.parameter == "block_mask" and "(300, 300)" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InputError) as e:
        masks.from_block_mask(kv_num_blocks=bm.kv_num_blocks, kv_indices=bm.kv_indices, block_size=32).compile(333)
    assert e.value.parameter == "block_mask" and "row blocks" in str(e.value)


def test_block_mask_disagreement_is_reported():
    from torch.nn.attention.flex_attention import create_block_mask

    bm = create_block_mask(doc_causal_torch, None, None, 333, 333, device="cpu", BLOCK_SIZE=64)
    bi = mm.block_index(bm)
    assert mm.agreement(bi, 333, 333).agrees
    a = mm.agreement(bi, 333, 333, mask_mod=lambda b, h, q, kv: q >= kv)  # causal over all documents
    assert not a.agrees and a.dropped > 0 and a.first["dropped"][:2] == (0, 0) and "dropped" in str(a)
    causal = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 333, 333, device="cpu", BLOCK_SIZE=64)
    a = mm.agreement(mm.block_index(causal), 333, 333, mask_mod=doc_causal)
    assert a.extra > 0 and a.dropped == 0 and a.wrong_full > 0


def _bad(fn):
    with pytest.raises(InputError) as e:
        masks.from_mask_mod(fn).compile(100)
    assert "\n" not in str(e.value)
    return e.value


def test_bad_mask_mods_are_one_line():
    def raises(b, h, q, kv):
        raise ZeroDivisionError("no")

    assert "raised ZeroDivisionError" in str(_bad(raises)) and _bad(raises).parameter == "mask_mod"
    assert "booleans" in str(_bad(lambda b, h, q, kv: q - kv))
    assert "four arguments" in str(_bad(lambda q, kv: q >= kv))
    assert "broadcasts" in str(_bad(lambda b, h, q, kv: np.ones(3, bool)))
    meta = torch.zeros(100, dtype=torch.long, device="meta")
    assert "CPU" in str(_bad(lambda b, h, q, kv: meta[q] == meta[kv]))
    with pytest.raises(InputError) as e:
        masks.from_mask_mod(3)
    assert e.value.parameter == "mask_mod"


def test_long_mask_mod_is_priced_up_front():
    with pytest.raises(InputError) as e:
        iosim.run("flash2", N=1 << 18, d=64, M=65536, mask=masks.from_mask_mod(doc_causal), count_only=True)
    assert e.value.parameter == "allow_long" and "mask_mod" in str(e.value)
    with pytest.raises(InputError) as e:
        masks.from_mask_mod(doc_causal, allow_long=True).compile(1 << 20)
    assert e.value.parameter == "mask"


def test_cli_mod_file(tmp_path, capsys):
    f = tmp_path / "masks.py"
    f.write_text("import numpy as np\ndoc = np.arange(256) // 100\n\n\ndef document(b, h, q_idx, kv_idx):\n"
                 "    return doc[q_idx] == doc[kv_idx]\n")  # fmt: skip
    assert main(["run", "flash2", "--N", "256", "--d", "16", "--M", "4096", "--mask", f"mod:{f}:document",
                 "--count-only"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"mod:{f}:document" in out and "exact" in out
    for spec, word in ((f"mod:{f}:nothing", "mask mod"), (f"mod:{tmp_path}/none.py:x", "mask file")):
        assert main(["run", "flash2", "--N", "256", "--d", "16", "--M", "4096", "--mask", spec]) == 2
        err = capsys.readouterr().err
        assert word in err and err.count("\n") == 1


def test_wide_masks_pack_partial_blocks_and_memory_is_bounded(monkeypatch):
    """At N > 64 blocks of 64 the partial blocks' words share table rows (several to a row); a mask_mod whose bits
    outgrow the memory allowed is one line, naming it."""
    N = 64 * 70 + 5

    def stripes(b, h, q, kv):
        return (q + kv) % 3 == 0

    m = masks.from_mask_mod(stripes).compile(N)
    assert m.params[4] > 1 and m.table.shape[0] < 71 + 71 * 71  # packed: far fewer rows than partial blocks
    rng = np.random.default_rng(1)
    for _ in range(200):
        r0, c0 = rng.integers(0, N, 2)
        nr, nc = rng.integers(1, min(300, N - r0) + 1), rng.integers(1, min(300, N - c0) + 1)
        want = int(stripes(0, 0, np.arange(r0, r0 + nr)[:, None], np.arange(c0, c0 + nc)[None, :]).sum())
        assert tm.mask_nnz(m.kind, m.params, m.table, r0, nr, c0, nc) == want
    import iosim.runner.estimate

    monkeypatch.setattr(iosim.runner.estimate, "available_bytes", lambda: 1 << 20)
    with pytest.raises(InputError) as e:
        masks.from_mask_mod(stripes).compile(N)
    assert e.value.parameter == "mask_mod" and "partial blocks" in str(e.value) and "\n" not in str(e.value)


BAD_MODS = {  # a mask_mod file's functions, each wrong in its own way, and what its one line says
    "raises": ("def raises(b, h, q_idx, kv_idx):\n    raise ZeroDivisionError('no')\n", "without raising"),
    "nonbool": ("def nonbool(b, h, q_idx, kv_idx):\n    return q_idx - kv_idx\n", "booleans"),
    "arity": ("def arity(q_idx, kv_idx):\n    return q_idx >= kv_idx\n", "four arguments"),
    "missing": ("", "must name a function"),
}
MASK_COMMANDS = [  # every command that takes --mask, at sizes that run in a moment
    ["run", "flash2", "--N", "64", "--d", "8", "--M", "1024", "--count-only"],
    ["run", "flash1", "--batch", "2", "--heads", "2", "--N", "64", "--d", "8", "--M", "1024", "--count-only"],
    ["compare", "--N", "64", "--d", "8", "--M", "1024"],
    ["bounds", "--N", "64", "--d", "8", "--M", "1024"],
    ["trace", "flash2", "--N", "64", "--d", "8", "--M", "1024", "--count-only", "-o", "{out}.csv"],
    ["show", "flash2", "--N", "64", "--d", "8", "--M", "1024", "--count-only", "--output", "{out}.png"],
    ["replay", "flash2", "--N", "64", "--d", "8", "--M", "1024", "--count-only"],
    ["pebble", "--from-run", "flash2", "--N", "4", "--d", "2", "--M", "40"],
    ["hierarchy", "flash2", "--N", "64", "--d", "8", "--M", "1024", "--C", "0"],
    ["kernel", "iosim/kernels/examples/torch_flex_template.py", "--N", "64", "--d", "8", "--like", "block-sparse",
     "--no-numerics"],
]  # fmt: skip


@pytest.mark.parametrize("argv", MASK_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_bad_mask_mod_is_one_line_on_every_command(argv, tmp_path, capsys, monkeypatch):
    """A mask_mod that raises, answers with other than booleans, takes other than four arguments, or is not in its
    file: one line naming it on stderr, exit 2, nothing on stdout and no output file, on every command that takes
    --mask (iosim sweep reports it per point, tests/test_sweep.py)."""
    monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[1])
    src = tmp_path / "bad.py"
    src.write_text("\n\n".join(code for code, _ in BAD_MODS.values() if code))
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in argv]
    for name, (_, says) in BAD_MODS.items():
        assert main([*argv, "--mask", f"mod:{src}:{name}"]) == 2, name
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and says in err and "mask" in err and out == "", (name, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py"]


EXITING = {  # a mask file that exits while it is read, or a mask_mod that exits when called: (file text, function)
    "module exit 0": ("import sys\nsys.exit(0)\n", "m"),
    "module exit 3": ("import sys\nsys.exit(3)\n", "m"),
    "function exit": ("import sys\n\ndef m(b, h, q_idx, kv_idx):\n    sys.exit(0)\n", "m"),
    "function SystemExit": ("def m(b, h, q_idx, kv_idx):\n    raise SystemExit('bye')\n", "m"),
}
SWEEP = ["sweep", "--algorithm", "flash2", "--N", "64", "--d", "8", "--M", "1024", "--no-cache", "--executor", "serial"]


@pytest.mark.parametrize("argv", [*MASK_COMMANDS, SWEEP], ids=lambda a: " ".join(a[:2]))
def test_a_mask_file_that_exits_is_one_line_on_every_command(argv, tmp_path, capsys, monkeypatch):
    """sys.exit (any code) or SystemExit in a mask file, at import or inside its mask_mod, never ends a command
    silently with the file's exit code: one line naming the mask file or mask_mod and the exit, exit 2, nothing on
    stdout, no output file, on every command that takes --mask."""
    monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[1])
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in argv]
    for case, (text, fn) in EXITING.items():
        src = tmp_path / "exits.py"
        src.write_text(text)
        assert main([*argv, "--mask", f"mod:{src}:{fn}"]) == 2, case
        out, err = capsys.readouterr()
        lines = [x for x in err.splitlines() if not x.startswith("iosim: compiling")]
        assert len(lines) == 1 and "must not exit" in lines[0] and "mask" in lines[0], (case, err)
        assert out == "" or (argv[0] == "sweep" and "1 not run" in out), (case, out)  # the sweep: its per-point summary
        assert sorted(p.name for p in tmp_path.iterdir()) == ["exits.py"], case


def test_a_mask_file_that_prints_keeps_stdout_clean(tmp_path, capsys):
    """What a mask file prints (at import and inside its mask_mod) goes to stderr: a --json run's stdout stays one
    JSON document, with the same counts as the silent file."""
    loud, quiet = tmp_path / "loud.py", tmp_path / "quiet.py"
    body = "def m(b, h, q_idx, kv_idx):\n    {p}return q_idx >= kv_idx\n"
    loud.write_text("print('read')\n" + body.format(p="print('called')\n    "))
    quiet.write_text(body.format(p=""))
    argv = ["run", "flash2", "--N", "64", "--d", "8", "--M", "1024", "--count-only", "--json", "--mask"]
    assert main([*argv, f"mod:{loud}:m"]) == 0
    out, err = capsys.readouterr()
    assert "read" in err and "called" in err
    assert main([*argv, f"mod:{quiet}:m"]) == 0
    out2, _ = capsys.readouterr()
    a, b = json.loads(out), json.loads(out2)
    assert a["total"] == b["total"] and a["per_array"] == b["per_array"]
