"""The SLURM recipes without SLURM: every recipe's dry run, refusals, shellcheck, one local run.

Every training recipe (a ``recipes/*.sh`` that sources ``common.sh``) is discovered: a new one is checked
at its intended node count (its ``#SBATCH --nodes``) and must come with an
invalid override in ``INVALID`` below. The real cluster is in test_slurm.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_ext.cli import recipe
from megatron_ext.config.exit_codes import ExitCode
from tests import waits
from tests.conftest import REPO
from tests.waits import QUICK_S

RECIPES_DIR = REPO / "recipes"
RECIPES = sorted(p for p in RECIPES_DIR.glob("*.sh") if 'source "${recipes}/common.sh"' in p.read_text())
"""The training recipes: every one that sources common.sh (not the preprocessing job, nor the shared words)."""
CPU_RECIPE = RECIPES_DIR / "gpt_tiny_cpu_pp2_vp2.sh"
SETTINGS = sorted(
    set(re.findall(r'"\$\{([A-Z_]+):=', (RECIPES_DIR / "common.sh").read_text()))
    | set(recipe.variables())
    | {"PYTHON", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"}
)
"""The environment variables the recipes read: common.sh's own and those megatron_ext.cli.recipe resolves."""

# An override per recipe that breaks a layout rule, and the validation module's message for it.
INVALID = {
    "gpt3_126m_tp1_pp1": (
        {"NNODES": "3"},
        "global_batch_size=256 is not divisible by micro_batch(8) × data_parallel(24) = 192",
    ),
    "gpt3_1.3b_tp1_pp1": (
        {"NNODES": "3"},
        "global_batch_size=512 is not divisible by micro_batch(4) × data_parallel(24) = 96",
    ),
    "gpt3_13b_tp1_pp2_vp10": (
        {"NNODES": "3"},
        "global_batch_size=1024 is not divisible by micro_batch(1) × data_parallel(12) = 12",
    ),
    "gpt3_175b_tp4_pp8_vp12": ({"NNODES": "3"}, "world_size=24 is not divisible by tensor(4) × pipeline(8) = 32"),
    "gpt_tiny_cpu_pp2_vp2": ({"NNODES": "3"}, "world_size=3 is not divisible by tensor(1) × pipeline(2) = 2"),
}


AGREEMENT = 0.03
"""A GPU recipe's default layout is the calculator's best for its GPUs, within 3% of it, or says why not."""
REASON = re.compile(r"^# Not the calculator's best: \S.{20,}", re.M)
"""The header line that gives the reason (for example memory headroom)."""


DOCUMENTED_GIB = {
    "gpt3_126m_tp1_pp1": 8.8,
    "gpt3_1.3b_tp1_pp1": 23.6,
    "gpt3_13b_tp1_pp2_vp10": 55.2,
    "gpt3_175b_tp4_pp8_vp12": 67.7,
}
"""Memory per GPU of each GPU recipe at its node count, as docs/slurm.md states it."""


def disagreement(recipe: Path, dry_run_output: str) -> str | None:
    """Why a recipe's layout, as its dry run printed the calculator's verdict, breaks the agreement rule."""
    if "memory estimate: tools/layout.py for" not in dry_run_output:
        return None  # GPU_PROFILE=none: no estimate (the CPU recipe)
    slower = re.search(r"this layout is ([\d.]+)% slower by this model", dry_run_output)
    explained = REASON.search(recipe.read_text()) is not None
    if "but tight on memory" in dry_run_output:  # faster than the best that fits with the reserve, but tight
        return None if explained else (
            f"{recipe.name}'s layout is tight on memory (the calculator ranks it after the layouts that fit with "
            "the reserve): give the reason in a '# Not the calculator's best: ...' header line, or use the best"
        )  # fmt: skip
    if slower is None:
        best = "calculator's best: this layout" in dry_run_output
        return None if best else "the dry run printed no comparison with the calculator's best"
    if float(slower.group(1)) / 100 <= AGREEMENT or explained:
        return None
    return (
        f"{recipe.name}'s layout is {slower.group(1)}% slower than the calculator's best: use that layout, or "
        "give the reason in a '# Not the calculator's best: ...' header line"
    )


def recipe_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """A clean environment: no SLURM job around, outputs under tmp_path, this interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    for name in SETTINGS:
        env.pop(name, None)
    env |= {"RUN_DIR": str(tmp_path / "run"), "PYTHON": sys.executable}
    return env | overrides


def run_recipe(recipe: Path, env: dict[str, str], timeout: float = QUICK_S) -> subprocess.CompletedProcess[str]:
    """Run a recipe; its printed commands are unwrapped (one line each) in stdout. The default bound is a dry
    run's or a refusal's: a recipe that trains needs ``timeout=RUN_S``."""
    proc = waits.run(["bash", str(recipe)], timeout=timeout, env=env, cwd=REPO)
    proc.stdout = proc.stdout.replace(" \\\n    ", " ")
    return proc


def intended_nodes(recipe: Path) -> int:
    match = re.search(r"^#SBATCH --nodes=(\d+)$", recipe.read_text(), re.M)
    assert match, f"{recipe.name} has no '#SBATCH --nodes=N' line"
    return int(match.group(1))


def gpus_per_node(recipe: Path) -> int:
    match = re.search(r'"\$\{GPUS_PER_NODE:=(\d+)\}"', recipe.read_text())
    assert match, f"{recipe.name} sets no GPUS_PER_NODE default"
    return int(match.group(1))


@pytest.mark.unit
def test_the_slurm_guide_gives_each_recipes_memory() -> None:
    figures = ", ".join(f"{gib}" for gib in DOCUMENTED_GIB.values())
    assert (
        f"`h100-sxm`: {figures.rsplit(', ', 1)[0]} and {list(DOCUMENTED_GIB.values())[-1]} GiB per GPU"
        in (REPO / "docs" / "slurm.md").read_text()
    )
    assert set(DOCUMENTED_GIB) == {p.stem for p in RECIPES if p != CPU_RECIPE}


@pytest.mark.unit
def test_the_shipped_recipes_are_all_discovered() -> None:
    names = {p.stem for p in RECIPES}
    assert {"gpt3_126m_tp1_pp1", "gpt3_1.3b_tp1_pp1", "gpt3_13b_tp1_pp2_vp10", "gpt3_175b_tp4_pp8_vp12"} <= names
    assert CPU_RECIPE in RECIPES
    missing = names - INVALID.keys()
    assert not missing, f"add an invalid override for {sorted(missing)} to INVALID in {__file__}"


@pytest.mark.unit
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_dry_run_at_the_intended_node_count(recipe: Path, tmp_path: Path) -> None:
    nodes, gpus = intended_nodes(recipe), gpus_per_node(recipe)
    # No NNODES given: the recipe's own default must be its #SBATCH --nodes.
    proc = run_recipe(recipe, recipe_env(tmp_path, DRY_RUN="1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"{recipe.stem}: {nodes} node{'s' if nodes > 1 else ''} × {gpus} = {nodes * gpus} processes" in out
    # The resolved job command: srun, one task per node, our torchrun over all nodes.
    assert f"srun --nodes {nodes} " in out
    # The task counts explicitly: sbatch exports SLURM_NTASKS, which srun would obey.
    assert f"--ntasks {nodes} --ntasks-per-node 1 " in out
    assert f"--nnodes {nodes} --nproc-per-node {gpus} " in out
    assert 'megatron_ext.cli.launch --node-rank "${SLURM_NODEID}"' in out
    assert f"{REPO}/pretrain_gpt.py --num-layers" in out
    assert "--exit-signal-handler" in out
    assert f"--load {tmp_path}/run/checkpoints" in out and f"--save {tmp_path}/run/checkpoints" in out
    # The validation: pretrain_gpt.py --dry-run at the job's world size, and the memory estimate.
    assert f"validation: pretrain_gpt.py --dry-run for world size {nodes * gpus}" in out
    assert "configuration is valid" in out
    assert re.search(r"memory estimate: (tools/layout.py for|skipped \(GPU_PROFILE=none)", out)
    # The recipe agrees with the calculator (issue 12): its best, within 3%, or a reason in the header.
    assert disagreement(recipe, out) is None, disagreement(recipe, out)
    if recipe.stem in DOCUMENTED_GIB:  # the memory docs/slurm.md gives, from the calculator's table
        row = re.search(r"GiB/GPU.*\n\s*(?:\S+\s+){6}([\d.]+)\s+yes", out)
        assert row is not None and float(row.group(1)) == DOCUMENTED_GIB[recipe.stem], out
    assert "DRY_RUN=1: nothing launched" in out
    assert not (tmp_path / "run").exists(), "a dry run must not write anything"


@pytest.mark.unit
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_invalid_override_is_refused_with_the_validation_message(recipe: Path, tmp_path: Path) -> None:
    overrides, message = INVALID[recipe.stem]
    proc = run_recipe(recipe, recipe_env(tmp_path, DRY_RUN="1", **overrides))
    assert proc.returncode == ExitCode.INVALID, proc.stdout + proc.stderr
    assert "error: invalid parallel layout:" in proc.stderr
    assert message in proc.stderr
    assert "refusing to start: pretrain_gpt.py --dry-run rejected this layout (exit 2)" in proc.stdout


@pytest.mark.unit
def test_a_recipe_layout_slower_than_the_calculators_best_needs_a_reason(tmp_path: Path) -> None:
    """GPT-3 175B as TP 8 PP 8 VP 4 (the recipe's layout before the calculator's time model chose TP 4 PP 8
    VP 12): about 10% slower by the model, so without a header reason the rule refuses it."""
    env = recipe_env(tmp_path, DRY_RUN="1", TP="8", VP_LAYERS="3")
    recipe_file = RECIPES_DIR / "gpt3_175b_tp4_pp8_vp12.sh"
    proc = run_recipe(recipe_file, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    problem = disagreement(recipe_file, proc.stdout)
    assert problem is not None and "slower than the calculator's best" in problem
    explained = tmp_path / "explained.sh"
    text = recipe_file.read_text().replace(
        "set -euo pipefail",
        "# Not the calculator's best: TP 8 keeps 20 GiB of headroom for longer sequences.\nset -euo pipefail",
    )
    explained.write_text(text)
    assert disagreement(explained, proc.stdout) is None


@pytest.mark.unit
def test_an_elastic_job_on_fewer_nodes_gets_a_layout_that_fits(tmp_path: Path) -> None:
    """docs/slurm.md's elastic example on 12 of the 175B recipe's 16 nodes: TP 4 × PP 8 would shard the optimizer
    over DP 3 only and does not fit, so the layout is re-planned and validated for 96 GPUs."""
    env = recipe_env(tmp_path, NNODES="12", ELASTIC="1", MIN_NODES="12", DRY_RUN="1")
    proc = run_recipe(RECIPES_DIR / "gpt3_175b_tp4_pp8_vp12.sh", env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("[elastic] 96 GPUs:"))
    assert "the recipe's layout needs" in line and "re-planned with policy any" in line, line
    assert "world size: 96 = TP 4 × PP 12 × DP 2 × VP 8" in proc.stdout
    assert "--dist-ckpt-optim-fully-reshardable" in proc.stdout
    assert "calculator's best: this layout" in proc.stdout


@pytest.mark.unit
def test_a_layout_estimated_not_to_fit_is_refused(tmp_path: Path) -> None:
    if not (REPO / "tools" / "layout.py").exists():
        pytest.fail("tools/layout.py is missing: the recipes' memory estimate needs it")
    # GPT-3 175B on one node: valid (TP 8, PP 1) but hundreds of GiB per GPU.
    env = recipe_env(tmp_path, DRY_RUN="1", NNODES="1", PP="1", VP_LAYERS="0")
    proc = run_recipe(RECIPES_DIR / "gpt3_175b_tp4_pp8_vp12.sh", env)
    assert proc.returncode == ExitCode.DOES_NOT_FIT, proc.stdout + proc.stderr
    assert "configuration is valid" in proc.stdout
    assert "refusing to start: estimated not to fit on GPU_PROFILE=h100-sxm" in proc.stdout


@pytest.mark.unit
def test_a_calibrated_profile_file_is_the_recipes_gpu_profile(tmp_path: Path) -> None:
    import dataclasses
    import json

    from megatron_ext.estimate.hardware import GIB, get_profile, profile_document

    # The same GPT-3 175B on one node, on a (made-up) GPU with memory enough: the recipe's estimate reads the file.
    big = dataclasses.replace(get_profile("h100-sxm"), name="big", memory_bytes=4096 * GIB)
    profile = tmp_path / "big.json"
    profile.write_text(json.dumps(profile_document(big)))
    env = recipe_env(tmp_path, DRY_RUN="1", NNODES="1", PP="1", VP_LAYERS="0", GPU_PROFILE=str(profile))
    proc = run_recipe(RECIPES_DIR / "gpt3_175b_tp4_pp8_vp12.sh", env)
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert f"memory estimate: tools/layout.py for 8 × {profile}" in proc.stdout


@pytest.mark.unit
def test_the_schedule_is_a_variable_and_the_dry_run_prints_its_bubble(tmp_path: Path) -> None:
    recipe = RECIPES_DIR / "gpt_tiny_cpu_pp2_vp2.sh"
    env = recipe_env(tmp_path, DRY_RUN="1", VP_LAYERS="0", SCHEDULE="zb-h1")
    proc = run_recipe(recipe, env)
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert "--enable-zero-bubble" in proc.stdout
    # PP 2, 8 sequences of 2 = 4 microbatches: (p-1)/(3*m) = 1/12.
    assert "schedule: ZB-H1 (--enable-zero-bubble): pipeline bubble (p-1)/(3*m) = 0.083" in proc.stdout
    refused = run_recipe(recipe, recipe_env(tmp_path, DRY_RUN="1", SCHEDULE="zb-h1"))
    assert refused.returncode == ExitCode.INVALID and "SCHEDULE=zb-h1 runs one model chunk per rank" in (
        refused.stdout + refused.stderr
    )
    # The recipe's own virtual stages (2 per rank): ZB interleaved, its bubble simulated beside interleaved 1F1B's.
    interleaved = run_recipe(recipe, recipe_env(tmp_path, DRY_RUN="1", SCHEDULE="zb-interleaved"))
    assert interleaved.returncode == ExitCode.OK, interleaved.stdout + interleaved.stderr
    assert "--enable-zero-bubble" in interleaved.stdout
    assert (
        "schedule: ZB interleaved (--enable-zero-bubble, 2 virtual stages): pipeline bubble 0.0" in interleaved.stdout
    )
    assert "(interleaved 1F1B's: (p-1)/(v*m) = 0.125)" in interleaved.stdout
    wrong = run_recipe(recipe, recipe_env(tmp_path, DRY_RUN="1", SCHEDULE="gpipe"))
    assert wrong.returncode == ExitCode.INVALID and "SCHEDULE must be 1f1b, zb-h1 or zb-interleaved" in (
        wrong.stdout + wrong.stderr
    )


@pytest.mark.unit
def test_per_gpu_tasks_and_a_container_when_asked(tmp_path: Path) -> None:
    env = recipe_env(
        tmp_path,
        DRY_RUN="1",
        LAUNCHER="srun",
        CONTAINER_IMAGE="nvcr.io#nvidia/pytorch:25.01-py3",
        CONTAINER_MOUNTS="/lustre:/lustre",
        SRUN_ARGS="--mpi=pmix --network=sn_all",
        EXTRA_ARGS="--log-interval 1 --no-load-rng",
        PYTHON="python",
    )
    proc = run_recipe(RECIPES_DIR / "gpt3_13b_tp1_pp2_vp10.sh", env)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "--container-image 'nvcr.io#nvidia/pytorch:25.01-py3' --container-mounts /lustre:/lustre" in out
    assert "--mpi=pmix --network=sn_all --ntasks 32 --ntasks-per-node 8 " in out
    assert "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS python" in out
    assert "--no-load-rng" in out
    assert "outside SLURM this machine runs" not in out  # pyxis needs srun


@pytest.mark.unit
def test_real_data_needs_a_tokenizer_and_is_passed_through(tmp_path: Path) -> None:
    recipe = RECIPES_DIR / "gpt3_126m_tp1_pp1.sh"
    proc = run_recipe(recipe, recipe_env(tmp_path, DRY_RUN="1", DATA_PATH="0.7 /data/web 0.3 /data/books"))
    assert proc.returncode == ExitCode.INVALID
    assert "DATA_PATH is set: set TOKENIZER_MODEL" in proc.stderr
    env = recipe_env(tmp_path, DRY_RUN="1", DATA_PATH="0.7 /data/web 0.3 /data/books", TOKENIZER_MODEL="/data/t.model")
    out = run_recipe(recipe, env).stdout
    assert "--data-path 0.7 /data/web 0.3 /data/books --split 969,30,1" in out
    assert "--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model /data/t.model" in out
    assert "--mock-data" not in out


@pytest.mark.unit
def test_refused_before_anything_starts(tmp_path: Path) -> None:
    """A real (not dry) run with a broken layout stops at validation, before any process is launched."""
    proc = run_recipe(CPU_RECIPE, recipe_env(tmp_path, NNODES="1", GPUS_PER_NODE="3"))
    assert proc.returncode == ExitCode.INVALID, proc.stdout + proc.stderr
    assert "world_size=3 is not divisible by tensor(1) × pipeline(2) = 2" in proc.stdout
    assert "megatron_ext.cli.launch" in proc.stdout  # the command it would have run is shown ...
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # ... but nothing trained
    assert not any((tmp_path / "run" / "checkpoints").iterdir())


@pytest.mark.unit
def test_outside_slurm_more_than_one_node_needs_sbatch(tmp_path: Path) -> None:
    proc = run_recipe(CPU_RECIPE, recipe_env(tmp_path))  # its default is 2 nodes
    assert proc.returncode == ExitCode.INVALID
    assert "outside SLURM only NNODES=1 runs here (got 2)" in proc.stderr


@pytest.mark.unit
def test_every_setting_of_common_sh_is_documented() -> None:
    doc = (REPO / "docs" / "slurm.md").read_text()
    undocumented = [name for name in SETTINGS if f"`{name}`" not in doc]
    assert not undocumented, f"docs/slurm.md does not describe {undocumented}"


@pytest.mark.unit
def test_a_zero_bubble_schedule_on_a_gpu_recipe_keeps_its_spec_and_is_estimated_as_such(tmp_path: Path) -> None:
    """Before: SCHEDULE=zb-interleaved on a GPU recipe failed unless EXTRA_ARGS added --transformer-impl local, and
    the recipe's estimate priced the run as interleaved 1F1B. Transformer Engine's layers now defer their weight
    gradients too: the recipe adds the schedule's flag and nothing else."""
    env = recipe_env(tmp_path, DRY_RUN="1", SCHEDULE="zb-interleaved")
    proc = run_recipe(RECIPES_DIR / "gpt3_13b_tp1_pp2_vp10.sh", env)
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert "--enable-zero-bubble" in proc.stdout and "--transformer-impl local" not in proc.stdout
    assert re.search(r"\n\s+1\s+2\s+10\s.*even, zero-bubble\n", proc.stdout), proc.stdout
