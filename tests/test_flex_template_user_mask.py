"""A user's own mask_mod (``mask="mod:FILE.py:NAME"``) in FlexAttention's template launcher
(iosim/kernels/examples/torch_flex_template.py): traced as FlexAttention traces it, rendered into torch's installed
template, counted in place under Triton's interpreter, and held against ``--like block-sparse --mask
mod:FILE.py:NAME`` array by array (its captured tensor included, at the index it is read at); its output equals
torch's eager flex_attention with the same mask_mod; a mask_mod the launcher cannot render is one line."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "iosim" / "kernels" / "examples" / "torch_flex_template.py"
MASKS = (
    "import torch\n\n"
    "doc = torch.repeat_interleave(torch.arange(3), torch.tensor([50, 80, 70])).to(torch.int32)\n"
    "window = torch.tensor([24, 64], dtype=torch.int32)\n\n\n"
    "def doc_window(b, h, q_idx, kv_idx):\n"
    "    return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx) & (q_idx - kv_idx < 40)\n\n\n"
    "def head_window(b, h, q_idx, kv_idx):\n"
    "    return (q_idx - kv_idx < window[h]) & (q_idx >= kv_idx)\n\n\n"
    "def chunks(b, h, q_idx, kv_idx):\n"
    "    return q_idx // 16 == kv_idx // 16\n"
)


def _skip_other_torch():
    from iosim.kernels.examples.torch_flex_template import TORCH

    if not torch.__version__.startswith(TORCH + "."):
        pytest.skip(f"the template's hooks are written against torch {TORCH}")


def partial_blocks(allowed: np.ndarray, block: int) -> int:
    """Blocks with some but not all of their block x block positions allowed, a padded position counting as not
    allowed (create_block_mask's rule): the blocks whose mask_mod the template evaluates."""
    N = allowed.shape[0]
    T = -(-N // block)
    pad = np.zeros((T * block, T * block), dtype=bool)
    pad[:N, :N] = allowed
    per = pad.reshape(T, block, T, block).sum(axis=(1, 3))
    return int(((per > 0) & (per < block * block)).sum())


def test_a_users_mask_mod_equals_block_sparse_in_every_array(tmp_path, capsys, monkeypatch):
    from iosim.cli import main

    _skip_other_torch()
    (tmp_path / "masks.py").write_text(MASKS)
    (tmp_path / "launcher.py").write_text(
        "from iosim.kernels.examples.torch_flex_template import launch as template\n\n\n"
        "def launch(N, d, H=1, B=1):\n    return template(N, d, block=32, H=H, B=B, mask='mod:masks.py:doc_window')\n"
    )
    monkeypatch.chdir(tmp_path)
    argv = ["kernel", "launcher.py", "--N", "200", "--d", "16", "--H", "2", "--B", "2", "--no-numerics",
            "--backend", "triton", "--like", "block-sparse", "--mask", "mod:masks.py:doc_window", "--indices",
            "template"]  # fmt: skip
    rc = main(argv)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:5] for line in out.splitlines() if "closed form to the word" in line}
    assert rc == 0 and set(rows) == {"Q", "K", "V", "O", "L", "kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                     "full_kv_indices", "doc"}, out  # fmt: skip
    q, kv = np.arange(200)[:, None], np.arange(200)[None, :]
    doc = np.repeat(np.arange(3), [50, 80, 70])
    allowed = (doc[q] == doc[kv]) & (q >= kv) & (q - kv < 40)
    words = 2 * 2 * partial_blocks(allowed, 32) * (32 + 32)  # B H x partial blocks x doc[q] and doc[kv] of a block
    assert rows["doc"] == [f"{words:,}", "0", f"{words:,}", "0"]


@pytest.mark.slow  # about 10 s on 2 cores; the fast case above holds the counts
def test_a_users_per_head_mask_mod_runs_as_eager_flex_attention(tmp_path):
    """A mask_mod reading h (a window per head, one BlockMask per head) counted in place: its captured tensor read
    once per partial block, its O equal to eager flex_attention's with the same mask_mod."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from iosim.kernels.counting import count_file

    _skip_other_torch()
    (tmp_path / "masks.py").write_text(MASKS)
    spec = f"mod:{tmp_path / 'masks.py'}:head_window"
    params = {"N": 100, "d": 16, "block": 16, "H": 2, "B": 1, "mask": spec}
    counts, numbers, arrays = count_file(str(TEMPLATE), "launch", backend="triton", params=params)
    assert counts.stray == [] and counts.out_of_bounds_lanes == 0
    assert numbers["buffers"] == {"window": ["h", "mask", "int32"]}
    q, kv = np.arange(100)[:, None], np.arange(100)[None, :]
    partial = sum(partial_blocks((q - kv < w) & (q >= kv), 16) for w in (24, 64))
    assert counts.per_array["window"].reads == partial  # one word per partial block of its head
    window = torch.tensor([24, 64], dtype=torch.int32)  # the mask written again here (dynamo cannot trace a
    # function of a file run by runpy, which the launcher loads; it traces it with make_fx)

    def head_window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx < window[h]) & (q_idx >= kv_idx)

    bm = create_block_mask(head_window, 1, 2, 100, 100, device="cpu", BLOCK_SIZE=16)
    Q, K, V = (torch.from_numpy(arrays[x]).reshape(1, 2, 100, 16).float() for x in "QKV")
    ref = flex_attention(Q, K, V, block_mask=bm)
    assert np.abs(arrays["O"].reshape(1, 2, 100, 16) - ref.numpy()).max() < 1e-5


def test_a_mask_mod_the_launcher_cannot_render_is_one_line(tmp_path):
    from iosim.base.errors import InputError
    from iosim.kernels.examples.torch_flex_template import launch

    _skip_other_torch()
    (tmp_path / "masks.py").write_text(MASKS)
    with pytest.raises(InputError, match="mask must be a mask_mod of comparisons") as e:
        launch(64, 16, mask=f"mod:{tmp_path / 'masks.py'}:chunks")  # floor division: not rendered
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=r"or mod:FILE.py:NAME"):
        launch(64, 16, mask="qkv")
