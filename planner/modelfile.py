"""The model-file contract: load a user's model.py and give the planner and runtime one handle.

A model file defines ``build_model(**kwargs) -> nn.Module`` and ``make_batch(batch_size, step=0)
-> (inputs, targets)``; optionally ``loss_fn(outputs, targets)`` and a ``TRAINING`` dict of
defaults. Everything that can go wrong while loading a user's file becomes a one-line
``UserInputError`` naming the file and the fix, because this is the first thing a new user meets.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner import vocab
from planner.errors import UserInputError
from planner.hf_config import config_digest, is_config_source, load_config_model
from planner.training import TRAINING_DEFAULTS
from planner.vocab import TENSOR_DTYPE

if TYPE_CHECKING:  # torch is imported where a model is built or run (see ``__getattr__``)
    import torch

OPTIMIZERS = vocab.OPTIMIZERS


def __getattr__(name: str) -> Any:
    """``DTYPES`` (training dtype name -> torch dtype), made on first use: torch is imported
    by what runs a model, not by loading a model file's hash for a cached trace (1.4 s)."""
    if name == "DTYPES":
        import torch

        return {n: getattr(torch, TENSOR_DTYPE[n]) for n in vocab.DTYPES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class ModelFile:
    """A model file; ``args`` are the keyword arguments passed to ``build_model``.

    The module is executed only when first needed: a cached trace needs just the file's hash,
    and importing a file that imports transformers costs seconds."""

    path: Path
    sha256: str
    source: str
    args: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    _module: Any = None

    @property
    def module(self) -> Any:
        if self._module is None:
            self._module = _execute(self.path, self.sha256)
            _check_args(self.path, self._module.build_model, self.args)
            user_training = getattr(self._module, "TRAINING", None)
            if isinstance(user_training, dict):
                for key, value in user_training.items():
                    self.training.setdefault(key, value)
        return self._module

    @property
    def has_loss_fn(self) -> bool:
        return callable(getattr(self.module, "loss_fn", None))

    @property
    def loss_gathers(self) -> bool:
        """Whether ``loss_fn`` takes ``gather`` (a loss over the whole batch under data
        parallelism: ``runtime/gather.py``)."""
        if not self.has_loss_fn:
            return False
        return "gather" in inspect.signature(self.module.loss_fn).parameters

    def build(self) -> torch.nn.Module:
        """Call ``build_model(**args)``; a failure names the file and the exception."""
        import torch

        try:
            model = self.module.build_model(**self.args)
        except TypeError as exc:
            raise UserInputError(
                f"{self.path.name}: build_model({_fmt_args(self.args)}) failed: {exc}; "
                "check the --model-arg names against build_model's signature"
            ) from exc
        except Exception as exc:  # the user's code: any exception is a user-facing problem
            raise UserInputError(
                f"{self.path.name}: build_model({_fmt_args(self.args)}) raised "
                f"{type(exc).__name__}: {_one_line(exc)}"
            ) from exc
        if not isinstance(model, torch.nn.Module):
            raise UserInputError(
                f"{self.path.name}: build_model() returned {type(model).__name__}, "
                "not a torch.nn.Module"
            )
        if not any(p.requires_grad for p in model.parameters()):
            raise UserInputError(
                f"{self.path.name}: build_model() returned a model with no trainable parameters: "
                "there is nothing to train (give the model parameters that require grad)"
            )
        return model

    def batch(self, batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], Any]:
        """``make_batch`` with its inputs normalised to a tuple of tensors."""
        import torch

        try:
            result = self.module.make_batch(batch_size, step=step)
        except Exception as exc:
            raise UserInputError(
                f"{self.path.name}: make_batch({batch_size}, step={step}) raised "
                f"{type(exc).__name__}: {_one_line(exc)}"
            ) from exc
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise UserInputError(
                f"{self.path.name}: make_batch must return (inputs, targets), "
                f"got {type(result).__name__}"
            )
        inputs, targets = result
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise UserInputError(
                f"{self.path.name}: make_batch's inputs must be a tensor or a tuple of tensors"
            )
        if any(t.shape[0] != batch_size for t in inputs if t.dim() > 0):
            raise UserInputError(
                f"{self.path.name}: make_batch({batch_size}) returned inputs whose first "
                "dimension is not the batch size"
            )
        return inputs, targets

    def loss(self, outputs: Any, targets: Any, gather: Callable | None = None) -> torch.Tensor:
        """``loss_fn(outputs, targets)``; ``gather`` is passed to a ``loss_fn`` that takes it
        (``loss_gathers``), the identity where None (one process)."""
        if gather is not None or self.loss_gathers:
            return self.module.loss_fn(outputs, targets, gather=gather or _whole)
        fn: Callable[[Any, Any], torch.Tensor] = getattr(self.module, "loss_fn", None) or (
            default_loss
        )
        return fn(outputs if fn is not default_loss else to_logits(outputs), targets)


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t


def slice_tree(obj: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every batched tensor in ``obj`` (0-d tensors and non-tensors
    stay): how the runtime cuts a batch into replicas' shares and micro-batches, and how the
    planner checks the loss on parts of one (``planner.trace.loss_samples``)."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(
        lambda t: t[start:stop] if isinstance(t, torch.Tensor) and t.dim() > 0 else t, obj
    )


def to_logits(outputs: Any) -> torch.Tensor:
    """Reduce a model's output to one tensor.

    The rule: a tensor is itself; an object or dict with ``logits`` gives that; otherwise the
    first tensor of a tuple/list/dict (HuggingFace ``ModelOutput`` is both an object and a dict).
    """
    import torch

    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, dict):
        logits = outputs.get("logits")
    if isinstance(logits, torch.Tensor):
        return logits
    values = outputs.values() if isinstance(outputs, dict) else outputs
    if isinstance(values, (tuple, list)) or isinstance(outputs, dict):
        for v in values:
            if isinstance(v, torch.Tensor):
                return v
    raise UserInputError(
        f"the model returned {type(outputs).__name__}, which holds no tensor: return the logits "
        "tensor, or define loss_fn(outputs, targets) in the model file"
    )


def default_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension, averaged over every other position."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_model_file(path: str | Path, args: dict[str, Any] | None = None) -> ModelFile:
    """Import a model file by path (inside the repository or anywhere else); a Hugging Face
    config (``hf:ORG/NAME``, a config.json or its directory) stands for one (planner.hf_config)."""
    if is_config_source(path):
        return _config_model_file(path, args)
    path = Path(path).expanduser()
    if not path.exists():
        raise UserInputError(f"model file {path} does not exist: give the path to a .py file")
    if path.is_dir() or path.suffix != ".py":
        raise UserInputError(f"model file {path} is not a Python file: give a .py file")
    try:
        source = path.read_bytes()
        source.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"model file {path} cannot be read as text: {exc}") from exc
    digest = hashlib.sha256(source).hexdigest()
    text = source.decode("utf-8")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise UserInputError(
            f"model file {path} has a syntax error at line {exc.lineno}: {exc.msg}"
        ) from exc
    defined = _top_level_names(tree)
    for required in ("build_model", "make_batch"):
        if required not in defined:
            raise UserInputError(
                f"model file {path} does not define {required}(): see the model-file "
                "contract in README (build_model() -> nn.Module, make_batch(batch_size, step=0))"
            )
    user_training, literal = _literal_training(tree)
    mf = ModelFile(path=path.resolve(), sha256=digest, source=text, args=dict(args or {}))
    if not literal:
        user_training = getattr(mf.module, "TRAINING", None)  # not a literal: run the file
    if user_training is not None and not isinstance(user_training, dict):
        raise UserInputError(f"model file {path}: TRAINING must be a dict")
    mf.training = {**TRAINING_DEFAULTS, **(user_training or {})}
    return mf


def _config_model_file(source: str | Path, args: dict[str, Any] | None) -> ModelFile:
    """A ModelFile whose module is a config's ConfigModel: its path and hash are the
    config.json's, its args the resolved task, sequence length, Hub id and overrides."""
    model = load_config_model(source, args)
    text = model.path.read_text()
    model.TRAINING = dict(TRAINING_DEFAULTS)
    return ModelFile(
        path=model.path,
        sha256=config_digest(model.path),
        source=text,
        args=model.args,
        training=dict(TRAINING_DEFAULTS),
        _module=model,
    )


def _execute(path: Path, digest: str) -> Any:
    name = f"meshplan_model_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserInputError(f"model file {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserInputError(
            f"model file {path} failed to import: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    for required in ("build_model", "make_batch"):
        if not callable(getattr(module, required, None)):
            raise UserInputError(
                f"model file {path}: {required} is not a function: see the model-file contract"
            )
    return module


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif not isinstance(node, ast.Expr):  # if/try/with at top level: check at import
            return names | {"build_model", "make_batch"}
    return names


def _literal_training(tree: ast.Module) -> tuple[dict[str, Any] | None, bool]:
    """TRAINING read without running the file, when it is a literal (the usual case)."""
    value = None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets, value_node = [node.target], node.value
        elif isinstance(node, ast.Assign):
            value_node = node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "TRAINING" for t in targets):
            try:
                value = ast.literal_eval(value_node) if value_node is not None else None
            except (ValueError, SyntaxError):
                return None, False
    return value, True


def _check_args(path: Path, fn: Callable[..., Any], args: dict[str, Any]) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    known = {p.name for p in params}
    unknown = sorted(set(args) - known)
    if unknown:
        raise UserInputError(
            f"{path.name}: build_model() takes no argument {unknown[0]!r}; it takes "
            f"{', '.join(sorted(known)) or 'none'}"
        )


def _fmt_args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("…" if len(text) > 300 else "")


def expert_modules(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """Modules that hold a mixture-of-experts layer's expert weights: every parameter of their
    own is a stack of per-expert matrices with one leading expert dimension (transformers'
    3-D ``*Experts`` modules, examples/moe.py's ``Experts``). Expert parallelism shards them
    along that dimension; the planner prices their parameters separately."""
    found: dict[str, dict[str, int]] = {}
    for name, m in model.named_modules():
        own = list(m.parameters(recurse=False))
        if not own or any(p.dim() < 3 for p in own):
            continue
        leading = {p.shape[0] for p in own}
        if len(leading) == 1 and (e := leading.pop()) >= 2:
            found[name] = {"num_experts": int(e), "params": sum(p.numel() for p in own)}
    return found


def parameter_names(model: torch.nn.Module) -> dict[str, list[str]]:
    """Canonical (first) name -> every name a parameter is reachable under; more than one for
    a tied weight (an output projection that is the token embedding). The tracer keys its
    parameters by the canonical name; the runtime keeps the tied ones one tensor."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {group[0]: group for group in names.values()}


def one_call_site(path: str) -> str:
    """The model's path of a traced module or tensor path: ``embed@1.weight`` -> ``embed.weight``
    (torch.export numbers the second and later calls of one module)."""
    return re.sub(r"@\d+", "", path)


def forward_takes_one_argument(module: torch.nn.Module) -> bool:
    """Whether ``module.forward`` has exactly one parameter, positional. One required argument
    is not enough: a module called with keywords (transformers' OPT positional embedding takes
    ``position_ids=``) would get a ParallelStyle's conversion, or a traced call's one input,
    on the wrong argument."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
