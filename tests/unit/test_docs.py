"""The documentation: the strict MkDocs build, docstrings of the public API, doctests, and the
code blocks of the docs pages.

CI runs only ``pytest``, so this file is where ``mkdocs build --strict`` runs in CI: a broken
cross-reference, a page missing from the nav or a docstring mkdocstrings cannot render fails it.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import rppo_td
from rppo_td import functional

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "rppo_td"

# a shape in the docstrings' notation: [W, T], [N, Lp], [*B, T, 1], [B_i, Lp], [N], ...
SHAPE = re.compile(r"\[\*?[A-Z][A-Za-z0-9_]*(?:, [^\]\n]+)*\]")


# ---- the strict build ----------------------------------------------------------------------------
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",  # no --quiet: it hides the warnings that --strict counts
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, (
        f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    )
    for page in ("index.html", "data-layout/index.html", "api/functional/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_figure_script_runs(tmp_path: Path) -> None:
    out = tmp_path / "figure.png"
    subprocess.run(
        [sys.executable, str(DOCS / "make_figures.py"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert out.stat().st_size > 1000


# ---- docstrings of the public API ----------------------------------------------------------------
def _public() -> list[tuple[str, object]]:
    names = [(f"rppo_td.{n}", getattr(rppo_td, n)) for n in rppo_td.__all__ if n != "functional"]
    names += [(f"rppo_td.functional.{n}", getattr(functional, n)) for n in functional.__all__]
    return names


@pytest.mark.parametrize(("name", "obj"), _public(), ids=[n for n, _ in _public()])
def test_public_name_has_example_and_shapes(name: str, obj: object) -> None:
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    assert ">>>" in doc, f"{name}'s docstring has no >>> example"
    assert SHAPE.search(doc), f"{name}'s docstring states no shape such as [W, T] or [N, Lp]"


def test_every_public_name_is_checked() -> None:
    assert set(rppo_td.__all__) == {n.split(".")[1] for n, _ in _public()} | {"functional"}
    assert inspect.getdoc(functional), "rppo_td.functional has no module docstring"


# ---- doctests of every rppo_td module ------------------------------------------------------------
def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py":  # running it would start the program
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("module_name", _modules())
def test_doctests(module_name: str) -> None:
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, module_name, globs=dict(vars(module))):
        if test.examples and test.name.startswith(module_name):
            runner.run(test, out=lambda text: None)
    result = runner.summarize(verbose=False)
    if result.failed:
        # run again, printing the report pytest shows on failure
        report: list[str] = []
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        for test in finder.find(module, module_name, globs=dict(vars(module))):
            if test.examples and test.name.startswith(module_name):
                runner.run(test, out=report.append)
        pytest.fail(
            f"{result.failed} doctest example(s) failed in {module_name}:\n" + "".join(report)
        )


def test_doctests_exist() -> None:
    """The pipeline's doctests are found (a broken finder would pass every module vacuously)."""
    module = importlib.import_module("rppo_td.transforms._padder")
    tests = doctest.DocTestFinder().find(module, "rppo_td.transforms._padder")
    assert sum(len(t.examples) for t in tests) >= 5


# ---- the docs pages' code blocks -----------------------------------------------------------------
# ```python blocks are run, each page in a fresh namespace; ```py blocks are excerpts and are not.
# Pages may use `rollout` (a chunked [W, T] rollout with GAE's inputs) and `padded` (its padded
# [N, Lp] sequences) without building them.
def _page_namespace() -> dict[str, object]:
    """What the pages' examples read (``rollout``, ``padded``): the setup block that
    docs/components/index.md gives its readers, run as they would run it."""
    text = (DOCS / "components" / "index.md").read_text()
    section = text.split("## The examples on these pages", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "docs/components/index.md lost the setup block of its examples"
    namespace: dict[str, object] = {}
    exec(compile(found.group(1), "docs/components/index.md setup", "exec"), namespace)
    return namespace


def _pages_with_code() -> list[Path]:
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [p for p in pages if "```python" in p.read_text()]


@pytest.mark.parametrize(
    "page", _pages_with_code(), ids=[p.relative_to(ROOT).as_posix() for p in _pages_with_code()]
)
def test_docs_code_blocks_run(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    namespace = _page_namespace()
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
        code = compile(block, f"{page.relative_to(ROOT)} block {number}", "exec")
        exec(code, namespace)


def test_some_pages_have_code() -> None:
    pages = {p.relative_to(ROOT).as_posix() for p in _pages_with_code()}
    expected = {"README.md", "docs/torchrl.md", "docs/components/sequence-padder.md"}
    assert expected <= pages


# ---- what docs/torchrl.md says about TorchRL's ClipPPOLoss ---------------------------------------
def test_clip_ppo_loss_with_loss_mask_ignores_padding() -> None:
    """``loss_mask_key = "loss_mask"`` makes every loss term blind to what padding holds."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import (
        MLP,
        LSTMModule,
        ProbabilisticActor,
        ValueOperator,
        set_recurrent_mode,
    )
    from torchrl.objectives import ClipPPOLoss

    torch.manual_seed(0)
    W, T, H = 2, 12, 8
    lstm = LSTMModule(input_size=3, hidden_size=H, in_key="observation", out_key="embed")
    head = TensorDictModule(
        MLP(in_features=H, out_features=2, num_cells=[8]), ["embed"], ["logits"]
    )
    actor = ProbabilisticActor(
        TensorDictSequential(lstm, head),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = TensorDictSequential(
        lstm, ValueOperator(MLP(in_features=H, out_features=1, num_cells=[8]), in_keys=["embed"])
    )
    done = torch.zeros(W, T, 1, dtype=torch.bool)
    done[0, 4] = True
    is_init = torch.zeros(W, T, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[0, 5] = True
    rollout = TensorDict(
        {
            "observation": torch.randn(W, T, 3),
            "action": torch.randint(0, 2, (W, T)),
            "action_log_prob": -torch.rand(W, T),
            "is_init": is_init,
            "recurrent_state_h": torch.randn(W, T, 1, H),
            "recurrent_state_c": torch.randn(W, T, 1, H),
            "advantage": torch.randn(W, T, 1),
            "value_target": torch.randn(W, T, 1),
            "next": {"done": done, "terminated": done, "reward": torch.ones(W, T, 1)},
        },
        batch_size=[W, T],
    )
    rollout = rppo_td.SequenceChunker(sequence_length=4)(rppo_td.EpisodeSplitter()(rollout))
    padded = rppo_td.SequencePadder()(rollout)
    pad = ~padded["loss_mask"]
    assert pad.any()
    corrupted = padded.clone()
    corrupted["advantage"][pad] = 1e6
    corrupted["value_target"][pad] = -1e6
    corrupted["action_log_prob"][pad] = -50.0
    corrupted["observation"][pad] = 123.0

    loss_fn = ClipPPOLoss(actor, critic, entropy_coeff=0.01)
    loss_fn.loss_mask_key = "loss_mask"
    with set_recurrent_mode(True):
        clean, dirty = loss_fn(padded), loss_fn(corrupted)
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(clean[key], dirty[key], msg=key)
