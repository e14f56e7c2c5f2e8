"""Will a block's tensor-parallel variant run correctly as the user's eager code?

The sharding ILP reasons on the exported graph, where every ``view`` has concrete sizes. The
runtime runs the model's own Python on local shards, and there a ``view`` infers only the
dimension the author wrote as -1. transformers' OPT writes ``view(bsz, -1, num_heads,
head_dim)``: on a column-parallel shard of q the -1 absorbs the missing heads as a shorter
*sequence*, the shapes still agree downstream, and the model silently trains something else.
Llama writes ``view(*input_shape, -1, head_dim)``, so its local view has the local heads.

So before a sharded variant is priced, the block's first module is run on the meta device
twice with the inputs it gets in the model's forward: as is, and with the weights the plan
shards cut to their local shape (what the runtime's ParallelStyles leave each rank). Every
reshape of the local run must move the split dimension where the ILP's own rule
(``reshape_dim``) moves it; a reshape that does otherwise, or a local run that fails,
rejects the variant with a one-line reason. Meta tensors allocate nothing: one probe of a
transformer layer takes milliseconds.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from planner.atomic import write_text_atomic
from planner.cost import sharding
from planner.modelfile import ModelFile
from planner.trace.cache import cache_dir
from planner.vocab import IN_OUT, base_style

if TYPE_CHECKING:  # torch is imported where a probe runs: a re-plan reads cached verdicts
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode


class EagerShardProbe:
    """One per planning run: the meta model and each block module's captured inputs are built
    on first use (importing a transformers model file costs seconds). Verdicts are kept in the
    trace cache's folder under the trace's key and a hash of the code that decides them, so a
    re-plan runs no probe and an edited probe never reads an older one's verdicts."""

    def __init__(
        self, mf: ModelFile, dtype: str, trace_key: str | None = None, repeats: list[dict] = ()
    ) -> None:
        """``trace_key``: the cached trace's key (None: keep verdicts for this run only).
        ``repeats``: the trace's repeated containers (``planner.trace.repeats.Repeat``'s
        fields, as ``planner.api.TracedModel`` holds them): the inputs
        are captured with them cut to their traced members, and again in full only if a
        module beyond those is probed."""
        self.mf, self.dtype = mf, dtype
        self._repeats = list(repeats)
        self._path = _verdicts_path(trace_key) if trace_key else None
        # [reason ("" = runs as priced), the column-parallel modules to blame] per probe
        self.verdicts: dict[str, list] = _read_json(self._path) if self._path else {}
        self._probed = 0
        self._model: nn.Module | None = None
        self._inputs: dict[str, tuple[tuple, dict]] = {}
        self._mode: FakeTensorMode | None = None
        # (module, its column-parallel modules) -> the whole block's run (``_whole_run``)
        self._whole: dict[tuple[str, frozenset[str]], tuple] = {}

    def save(self) -> None:
        """Keep this run's new verdicts for the next plan of the same trace."""
        if self._path is not None and self._probed:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(self._path, json.dumps(self.verdicts, sort_keys=True))
            except OSError:
                pass  # a cache that cannot be written only costs time

    def adopt(self, verdicts: dict[str, list]) -> None:
        """Take the verdicts another copy of this probe reached (a forked search's) where this
        one has none, to be noted and saved as if reached here."""
        for key, verdict in verdicts.items():
            if key not in self.verdicts:
                self.verdicts[key] = verdict
                self._probed += 1

    def notes(self) -> list[str]:
        """One line per block module whose code misreads some local shard (its first reason),
        or whose head-count attributes the runtime sets to their local values."""
        first: dict[str, str] = {}
        for key, (reason, _, fix) in sorted(self.verdicts.items()):
            if reason and fix:
                reason = (
                    f"{reason.partition(':')[0]}: its code views by a fixed head count; each "
                    f"rank runs it with {', '.join(fix)} set to the local count (split by heads)"
                )
            if reason:
                first.setdefault(json.loads(key)[0], reason)
        return [f"tensor parallelism: {r}" for _, r in sorted(first.items())]

    def load(self) -> None:
        """Build the meta model and capture the block modules' inputs now, as the first probe
        would (``planner.api.ilps_beside`` does it while a forked copy solves sharding ILPs)."""
        from planner.trace.export import quiet_torch_logs

        with quiet_torch_logs():  # as _verdict runs it
            self._load()

    def _load(self) -> nn.Module:
        from torch._subclasses.fake_tensor import FakeTensorMode

        from planner.trace.export import build_meta_model
        from planner.trace.repeats import Repeat, cut

        if self._model is None:
            repeats = [Repeat(**r) for r in self._repeats]
            model = build_meta_model(self.mf, self.dtype)
            names = {m: n for n, m in model.named_modules()}
            # Meta tensors first; where the model's code asks a meta tensor for data
            # (transformers' mask code checks packed sequences with .all() unless it sees a
            # FakeTensor, as StableLM's forward does), again under fake tensors, which such code
            # recognises as tracing. The probes then run under the mode that reached the blocks.
            for mode in (None, FakeTensorMode(allow_non_fake_inputs=True)):
                self._inputs.clear()
                with cut(model, repeats):
                    if self._capture(model, names, mode):
                        break
            self._mode = mode
            self._model = model
            self._whole.clear()  # runs of another model's modules, on other inputs
        return self._model

    def _inputs_of(self, module: str) -> tuple[tuple, dict] | None:
        """``module``'s captured inputs; a module the cut forward did not reach (a member
        past the traced ones) has the full forward run for it, once."""
        self._load()
        if module not in self._inputs and self._repeats:
            self._repeats, self._model = [], None
            self._load()
        return self._inputs.get(module)

    def _capture(self, model: nn.Module, names: dict, mode) -> bool:
        """Each module's first inputs in one forward under ``mode`` (None: plain meta
        tensors); whether the forward ran to the end."""
        import torch

        from planner.trace.export import batch_statistics_samples, meta_inputs

        captured = self._inputs

        def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
            captured.setdefault(names[module], (args, kwargs))

        handles = [m.register_forward_pre_hook(grab, with_kwargs=True) for m in names]
        try:
            with torch.no_grad(), torch.device("meta"), mode or contextlib.nullcontext():
                model(*meta_inputs(self.mf, batch_statistics_samples(model), self.dtype))
            return True
        except Exception:  # noqa: BLE001 (data-dependent code, e.g. .item(), runs only
            # under torch.export's tracing): modules not reached stay unprobed
            return False
        finally:
            for h in handles:
                h.remove()

    def reject(self, cls: str, module: str, tp_plan: dict[str, str], t: int) -> str | None:
        """Why running ``module`` with ``tp_plan`` on ``t`` devices would not compute what the
        plan prices, or None when it would (or when the probe cannot tell: a block of several
        modules, a style other than colwise/rowwise, a module the meta forward did not reach
        because the model's code needs data, such as ``.item()``, before it). Blocks of one
        class (``cls``) share the verdict of the first one probed."""
        return self._verdict(cls, module, tp_plan, t)[0] or None

    def unsafe_outputs(self, cls: str, module: str, tp_plan: dict[str, str], t: int) -> set[str]:
        """The column-parallel modules (paths relative to ``module``) whose local outputs the
        first misread reshape of a rejected ``tp_plan`` derives from."""
        return set(self._verdict(cls, module, tp_plan, t)[1])

    def local_attributes(self, cls: str, module: str, tp_plan: dict[str, str], t: int) -> list[str]:
        """For a rejected ``tp_plan``: the attribute paths (full, under ``module``) that, each
        divided by ``t`` on every rank, make the code read its shards as priced (a view by
        ``self.num_heads``, see ``_local_fix``); [] when none does or none is needed."""
        fix = self._verdict(cls, module, tp_plan, t)[2]
        return [_join(module, rel) for rel in fix]

    def _verdict(self, cls: str, module: str, tp_plan: dict[str, str], t: int) -> list:
        if not tp_plan or {base_style(s) for s in tp_plan.values()} - {
            "colwise",
            "colwise_gather",
            "rowwise",
        }:
            return ["", [], []]
        plan = _relative(tp_plan, module)
        key = json.dumps([cls, t, sorted(plan.items())])
        if key not in self.verdicts:
            from planner.trace.export import quiet_torch_logs

            with quiet_torch_logs():  # fake tensors log each failing meta kernel at ERROR
                reason, blame, fix = self._probe(module, plan, t)
            self.verdicts[key] = [reason, sorted(blame), fix]
            self._probed += 1
        return self.verdicts[key]

    def _probe(self, module: str, plan: dict[str, str], t: int) -> tuple[str, set[str], list]:
        """The verdict on ``plan`` for ``module``'s code, and the head-count attributes whose
        local values make a misreading code read its shards right (see ``_local_fix``)."""
        captured = self._inputs_of(module)  # may reload the model: read it after
        model = self._load()
        if captured is None:
            return "", set(), []
        whole = model.get_submodule(module)
        local = copy.deepcopy(whole)
        for rel, style in plan.items():
            _cut(local.get_submodule(rel) if rel else local, style, t)
        seen, _, exc = self._whole_run(whole, module, plan)
        if exc is not None:
            # the whole block fails here too (a kernel the meta device lacks for this dtype:
            # torch's grouped product of experts takes bf16 only): the probe cannot tell,
            # which is no reason to refuse the shards
            return "", set(), []
        reason, blame = self._judge(module, plan, t, seen, local)
        if not reason:
            return "", set(), []
        return reason, blame, _local_fix(self, module, plan, t, seen, local)

    def _whole_run(
        self, whole: nn.Module, module: str, plan: dict[str, str]
    ) -> tuple[list, frozenset, Exception | None]:
        """``_run`` of the whole (unsharded) block, once per set of column-parallel modules
        the plan marks: the whole block's run reads nothing else of the plan (no weight is
        cut, and only column-parallel outputs seed the reshapes' provenance), and not the
        degree, so the plans of one block at TP 2, 4, 8 ... and their row-parallel parts
        share it (Llama-3-70B / 64: one meta forward of a layer per plan instead of one per
        plan and degree). The local run, which reads the degree and the whole plan, runs
        each time."""
        key = (module, _colwise(plan))
        if key not in self._whole:
            self._whole[key] = self._run(whole, module, plan)
        return self._whole[key]

    def _run(
        self, m: nn.Module, module: str, plan: dict[str, str]
    ) -> tuple[list, frozenset, Exception | None]:
        """Run ``m`` (the block or its local copy) on the block's captured inputs: the reshapes
        it ran, what the op that raised derives from, and the exception (None: it ran)."""
        import torch

        from planner.cost.reshapes import Reshapes

        args, kwargs = self._inputs[module]
        rec = Reshapes()
        handles = [
            m.get_submodule(rel).register_forward_hook(
                lambda _m, _a, out, rel=rel, rec=rec: rec.mark(out, rel)
            )
            for rel in _colwise(plan)
        ]
        try:
            with (
                torch.no_grad(),
                torch.device("meta"),
                self._mode or contextlib.nullcontext(),
                rec,
            ):
                m(*args, **kwargs)
        except Exception as exc:  # the user's code on local shards: any failure counts
            return rec.seen, rec.failed, exc
        finally:
            for h in handles:
                h.remove()
        return rec.seen, rec.failed, None

    def _judge(
        self, module: str, plan: dict[str, str], t: int, whole: list, local: nn.Module
    ) -> tuple[str, set[str]]:
        """Why ``local`` (the block with its weights cut) misreads its shards, and the
        column-parallel modules to blame; ("", set()) when it runs as priced."""
        seen, failed, exc = self._run(local, module, plan)
        if exc is None:
            return _first_misplaced(module, whole, seen, t)
        # a misread reshape before the failure (OPT's eager attention scores, keyed by half
        # the sequence, then fail to broadcast with the mask) is to blame
        found = _first_misplaced(module, whole[: len(seen)], seen, t)
        if found[1]:
            return found
        return (
            f"{module}: its code fails on local shards "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})",
            set(failed),  # the column-parallel outputs the failing op reads
        )


# The most head-count attribute sets one probe tries (each is one meta forward of the block).
MAX_FIXES = 64


def _local_fix(
    probe: EagerShardProbe, module: str, plan: dict[str, str], t: int, whole: list, local
) -> list[str]:
    """The integer attributes of the block's modules (paths relative to ``module``) that, set
    to their value over ``t`` on each rank, make its code read its local shards as the plan
    prices them; [] when none does.

    A view that fixes the head count (transformers' OPT, Whisper, PatchTST:
    ``view(bsz, -1, self.num_heads, self.head_dim)``) reads the count from an attribute of
    the module. Under heads split over ``t`` ranks each holds ``num_heads / t`` of them, so the
    same code with ``num_heads`` set to the local count views its shard by its own heads: what
    Megatron's attention does. The candidates are the module attributes that hold some size a
    reshape of a column-parallel output in the whole block fixes and that ``t`` divides, held
    by modules that hold no weight of their own (a Linear's ``out_features`` is not read by
    its code); each alone, then each pair, is set on a copy of the local block, which must
    then run every reshape as the ILP's rule moves the split dim. The runtime sets the same
    attributes on each rank (``runtime.local_attributes``)."""
    fixed = {d for _, _, g_out, came in whole if came for d in g_out}
    candidates = [
        (rel, name)
        for rel, sub in local.named_modules()
        if not any(True for _ in sub.parameters(recurse=False))  # code, not a weight's holder
        for name, value in vars(sub).items()
        if type(value) is int and value > 1 and value % t == 0 and value in fixed
    ]
    # one attribute, else two (StableLM views q by num_heads, k and v by num_key_value_heads)
    tries = [[c] for c in candidates] + [list(p) for p in itertools.combinations(candidates, 2)]
    for chosen in tries[:MAX_FIXES]:
        trial = copy.deepcopy(local)
        for rel, name in chosen:
            sub = trial.get_submodule(rel)
            setattr(sub, name, getattr(sub, name) // t)
        if not probe._judge(module, plan, t, whole, trial)[0]:
            return sorted(f"{rel}.{name}" if rel else name for rel, name in chosen)
    return []


def _colwise(plan: dict[str, str]) -> frozenset[str]:
    """The modules (relative, not the block itself) whose outputs a plan splits by column:
    the probe marks their outputs, whose reshapes it checks."""
    return frozenset(rel for rel, style in plan.items() if base_style(style) == "colwise" and rel)


def _relative(tp_plan: dict[str, str], module: str) -> dict[str, str]:
    prefix = module + "."
    return {
        (f[len(prefix) :] if f.startswith(prefix) else "" if f == module else f): s
        for f, s in tp_plan.items()
    }


def _join(module: str, rel: str) -> str:
    return f"{module}.{rel}" if rel else module


def _cut(m: nn.Module, style: str, t: int) -> None:
    """Give ``m`` the local weight shape torch's ColwiseParallel / RowwiseParallel leave (a
    gathered column-parallel module gives the code around it its whole output: left whole)."""
    import torch
    from torch import nn

    w = getattr(m, "weight", None)
    base = base_style(style)
    if base == "colwise_gather":
        return
    if style.endswith(IN_OUT):
        # meshplan's own styles run the module's forward on DTensors (global shapes inside,
        # ``runtime.parallelize``): it takes the local input shard and gives the local output
        if base == "colwise":
            m.register_forward_hook(lambda _m, _a, out: out.narrow(-1, 0, out.shape[-1] // t))
        else:
            m.register_forward_pre_hook(
                lambda _m, args: (torch.cat([args[0]] * t, dim=-1), *args[1:])
            )
        return
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return
    out_dim = 1 if isinstance(m, nn.Embedding) else 0
    dim = out_dim if base == "colwise" else 1 - out_dim
    shape = list(w.shape)
    shape[dim] //= t
    m.weight = nn.Parameter(torch.empty(shape, dtype=w.dtype, device="meta"))
    bias = getattr(m, "bias", None)
    if base == "colwise" and isinstance(bias, torch.Tensor) and not isinstance(m, nn.Embedding):
        m.bias = nn.Parameter(torch.empty(shape[out_dim], dtype=bias.dtype, device="meta"))


def _verdicts_path(trace_key: str) -> Path:
    digest = hashlib.sha256()
    # the probe, the reshapes it records and the reshape rule it applies
    for module in (__file__, Path(__file__).with_name("reshapes.py"), sharding.__file__):
        digest.update(Path(module).read_bytes())
    return cache_dir() / "probes" / f"{trace_key}-{digest.hexdigest()[:16]}.json"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _first_misplaced(module: str, whole: list, local: list, t: int) -> tuple[str, set[str]]:
    if len(whole) != len(local):
        return f"{module}: its code takes another path on local shards", set()
    for (_, g_in, g_out, _), (_, l_in, l_out, came) in zip(whole, local):
        split = [d for d, (g, x) in enumerate(zip(g_in, l_in)) if g != x]
        if len(g_in) != len(l_in) or len(split) > 1:
            return (
                f"{module}: a reshape sees {list(l_in)} on local shards, not one dim of "
                f"{list(g_in)} split",
                set(came),
            )
        want = list(g_out)
        if split:
            e = sharding.reshape_dim(g_in, g_out, split[0], t)
            if e is None:
                return f"{module}: a reshape of {list(g_in)} cannot keep dim {split[0]} split", set(
                    came
                )
            want[e] //= t
        if list(l_out) != want:
            return (
                f"{module}: its code reshapes a local shard {list(l_in)} to {list(l_out)}, not "
                f"{want} (a view that fixes the head count and infers another dim, such as "
                "view(batch, -1, heads, head_dim)); its column-parallel outputs stay DTensors",
                set(came),
            )
    return "", set()
