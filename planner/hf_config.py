"""A Hugging Face model with no model file: a ``config.json`` (local, or ``hf:ORG/NAME`` on the
Hub) turned into the model-file contract the rest of the planner already reads.

``plan hf:meta-llama/Llama-3.1-8B --gpus 64`` and ``plan path/to/config.json`` (or its
directory) give a ``ConfigModel`` that has what a model file defines: ``build_model`` (the
task's ``AutoModelFor...from_config``, called by the planner under the meta device, so no
weight is ever allocated or downloaded), ``make_batch`` (a synthetic, deterministic batch
shaped by the config and ``seq_len``) and ``TRAINING``. The loss is the task's usual one:
cross-entropy over the logits (next-token for causal LMs, the masked 15% for masked LMs, the
label for classifiers), which is ``planner.modelfile.default_loss`` with ``-100`` ignored.

The plan records the config's path, its hash and ``args`` (the task, the sequence length, the
Hub id and any config overrides), so ``plan run plan.json`` rebuilds the same model. Only the
config file is ever fetched from the Hub, through ``huggingface_hub`` (cached, and honouring
``HF_HUB_OFFLINE``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from planner.errors import UserInputError

HUB_PREFIX = "hf:"
CONFIG_NAME = "config.json"
# The longest default sequence: a 128k-context config would otherwise plan 128k-token
# samples, which is long-context training, not the usual pre-training length.
MAX_DEFAULT_SEQ_LEN = 8192
# Config keys that hold a text model's context length, in the order families use them.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")
# Families whose learned positions start after the padding index (RoBERTa's
# ``create_position_ids_from_input_ids``): pad_token_id + 1 of their table are never a position.
PADDING_OFFSET_POSITIONS = (
    "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm",
    "data2vec-text", "longformer", "ibert", "xmod",
)  # fmt: skip
# The length relative-position families (T5: no position table) default to: T5's
# pre-training input length (Raffel et al. 2020, section 3.1.2).
RELATIVE_POSITION_SEQ_LEN = 512
# Share of positions a masked LM predicts (BERT: Devlin et al. 2019, section 3.1).
MASKED_SHARE = 0.15
# Targets cross-entropy skips (torch's default ignore_index, which transformers uses too).
IGNORED = -100
# One second of 16 kHz audio: the default input of an audio classifier.
AUDIO_SAMPLES = 16000
# Image side when a vision config names none (ImageNet's usual 224).
DEFAULT_IMAGE_SIZE = 224
# args keys that are not config overrides.
RESERVED_ARGS = ("task", "seq_len", "hub")


class Task(str, Enum):
    """What the model is trained to do; the value is what ``--task`` takes."""

    CAUSAL_LM = "causal-lm"
    MASKED_LM = "masked-lm"
    SEQ2SEQ_LM = "seq2seq-lm"
    SEQUENCE_CLASSIFICATION = "sequence-classification"
    TOKEN_CLASSIFICATION = "token-classification"
    IMAGE_CLASSIFICATION = "image-classification"
    AUDIO_CLASSIFICATION = "audio-classification"
    SPEECH_SEQ2SEQ = "speech-seq2seq"

    def __str__(self) -> str:
        return self.value


# Task -> (transformers' Auto class, the name of its architecture mapping); the mappings are
# checked in this order when the config's ``architectures`` is absent.
AUTO_CLASSES: dict[Task, tuple[str, str]] = {
    Task.CAUSAL_LM: ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    Task.SEQ2SEQ_LM: ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    Task.MASKED_LM: ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    Task.SPEECH_SEQ2SEQ: ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    Task.IMAGE_CLASSIFICATION: (
        "AutoModelForImageClassification",
        "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    ),
    Task.AUDIO_CLASSIFICATION: (
        "AutoModelForAudioClassification",
        "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    ),
    Task.SEQUENCE_CLASSIFICATION: (
        "AutoModelForSequenceClassification",
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    ),
    Task.TOKEN_CLASSIFICATION: (
        "AutoModelForTokenClassification",
        "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    ),
}
TASKS = tuple(t.value for t in Task)


def is_config_source(source: str | Path) -> bool:
    """Whether ``plan SOURCE`` names a Hugging Face config rather than a model file."""
    text = str(source)
    if text.startswith(HUB_PREFIX):
        return True
    path = Path(text).expanduser()
    return path.suffix == ".json" or (path.is_dir() and (path / CONFIG_NAME).is_file())


def source_name(source: str | Path) -> str:
    """A short name for the report directory: the model's, not ``config``."""
    text = str(source)
    if text.startswith(HUB_PREFIX):
        return text[len(HUB_PREFIX) :].rstrip("/").rpartition("/")[2]
    path = Path(text).expanduser().resolve()
    return path.parent.name if path.suffix == ".json" else path.name


def resolve_config(source: str | Path) -> tuple[Path, str | None]:
    """The local ``config.json`` of ``source`` and the Hub id it came from (None if local).

    A Hub id downloads only ``config.json`` into the Hugging Face cache (a later call, or one
    with ``HF_HUB_OFFLINE=1``, reads the cache)."""
    text = str(source)
    if not text.startswith(HUB_PREFIX):
        path = Path(text).expanduser()
        if path.is_dir():
            path = path / CONFIG_NAME
        if not path.is_file():
            raise UserInputError(
                f"{text}: no such config file: give a config.json, a directory holding one, "
                "or hf:ORG/NAME"
            )
        return path.resolve(), None
    repo_id = text[len(HUB_PREFIX) :].strip("/")
    if repo_id.count("/") > 1 or not repo_id:
        raise UserInputError(
            f"{text}: a Hub model is hf:ORG/NAME (e.g. hf:meta-llama/Llama-3.1-8B)"
        )
    return _download_config(repo_id), repo_id


def _download_config(repo_id: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(hf_hub_download(repo_id, CONFIG_NAME))
    except GatedRepoError as exc:
        raise UserInputError(
            f"hf:{repo_id} is gated: accept its licence on the Hub and log in "
            "(huggingface-cli login), or give a local copy of its config.json"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise UserInputError(
            f"hf:{repo_id}: no such model on the Hub (or it is private: log in first)"
        ) from exc
    except LocalEntryNotFoundError as exc:
        raise UserInputError(
            f"hf:{repo_id}: its config.json is not in the Hugging Face cache and the Hub "
            "cannot be reached (HF_HUB_OFFLINE, or no network): fetch it once online, or give "
            "a local config.json"
        ) from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise UserInputError(f"hf:{repo_id}: cannot fetch config.json: {_one_line(exc)}") from exc


@dataclass
class ConfigModel:
    """The model-file contract for one config: ``build_model``, ``make_batch``, ``TRAINING``.

    ``ModelFile`` holds it as its module; ``args`` are the resolved ``task``, ``seq_len``,
    ``hub`` and config overrides, which the plan records and ``build_model`` receives back."""

    path: Path
    config: Any  # transformers.PretrainedConfig, with the overrides applied
    task: Task
    seq_len: int
    args: dict[str, Any]
    TRAINING: dict[str, Any] = field(default_factory=dict)

    def build_model(self, **_: Any) -> Any:
        """The task's Auto class from the config, in fp32 (the planner prices the training
        dtype itself), with no KV cache and torch's fused attention where the family has it."""
        import torch
        import transformers

        auto = getattr(transformers, AUTO_CLASSES[self.task][0])
        try:
            model = auto.from_config(self.config, dtype=torch.float32)
        except Exception as exc:  # transformers' own error for a config it cannot build
            raise UserInputError(
                f"{self.path}: transformers cannot build {self.task} from this config: "
                f"{type(exc).__name__}: {_one_line(exc)}"
            ) from exc
        if self.task in (Task.SEQ2SEQ_LM, Task.SPEECH_SEQ2SEQ):
            return _encoder_decoder_class()(model)
        return model

    def make_batch(self, batch_size: int, step: int = 0) -> tuple[Any, Any]:
        """A synthetic batch: the same for every plan at a given step (seeded by it)."""
        import torch

        g = torch.Generator().manual_seed(4800 + step)
        cfg, s = self.config, self.seq_len
        if self.task is Task.IMAGE_CLASSIFICATION:
            channels, height, width = image_shape(cfg)
            images = torch.randn(batch_size, channels, height, width, generator=g)
            return images, torch.randint(0, cfg.num_labels, (batch_size,), generator=g)
        if self.task is Task.AUDIO_CLASSIFICATION:
            audio = torch.randn(batch_size, s, generator=g)
            return audio, torch.randint(0, cfg.num_labels, (batch_size,), generator=g)
        vocab = vocab_size(cfg)
        if self.task is Task.SPEECH_SEQ2SEQ:
            frames = 2 * cfg.max_source_positions  # the encoder's two stride-2 convolutions
            features = torch.randn(batch_size, cfg.num_mel_bins, frames, generator=g)
            tokens = torch.randint(0, vocab, (batch_size, s + 1), generator=g)
            return (features, tokens[:, :-1]), tokens[:, 1:]
        tokens = torch.randint(0, vocab, (batch_size, s + 1), generator=g)
        if self.task is Task.CAUSAL_LM:
            return tokens[:, :-1], tokens[:, 1:]
        if self.task is Task.SEQ2SEQ_LM:
            source = torch.randint(0, vocab, (batch_size, s), generator=g)
            return (source, tokens[:, :-1]), tokens[:, 1:]
        ids = tokens[:, :-1]
        if self.task is Task.MASKED_LM:
            predicted = torch.rand(batch_size, s, generator=g) < MASKED_SHARE
            return ids, torch.where(predicted, ids, torch.full_like(ids, IGNORED))
        if self.task is Task.TOKEN_CLASSIFICATION:
            return ids, torch.randint(0, cfg.num_labels, (batch_size, s), generator=g)
        return ids, torch.randint(0, cfg.num_labels, (batch_size,), generator=g)


@functools.cache
def _encoder_decoder_class() -> type:
    """The wrapper class, defined on first use so that importing this module needs no torch."""
    import torch

    class EncoderDecoder(torch.nn.Module):
        """An encoder-decoder taking (encoder inputs, decoder ids) positionally, as the
        model-file contract calls ``model(*inputs)``; returns the decoder's logits."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model
            self.encoder_key = model.main_input_name  # input_ids, or input_features (speech)

        def forward(self, encoder_inputs: Any, decoder_input_ids: Any) -> Any:
            kwargs = {self.encoder_key: encoder_inputs, "decoder_input_ids": decoder_input_ids}
            return self.model(**kwargs).logits

    return EncoderDecoder


def load_config_model(source: str | Path, args: dict[str, Any] | None = None) -> ConfigModel:
    """The ``ConfigModel`` of a config source; ``args`` may carry ``task``, ``seq_len`` and
    config overrides (``--model-arg num_hidden_layers=4``). Bad input is one line."""
    args = dict(args or {})
    hub = args.get("hub")
    text = str(source)
    if hub and not text.startswith(HUB_PREFIX) and not Path(text).is_file():
        text = HUB_PREFIX + hub  # the plan's cached copy is gone: fetch it again
    path, repo_id = resolve_config(text)
    config = _read_config(path, {k: v for k, v in args.items() if k not in RESERVED_ARGS})
    task = choose_task(config, args.get("task"), path)
    seq_len = args.get("seq_len") or default_seq_len(config, task, path)
    if not isinstance(seq_len, int) or seq_len <= 0:
        raise UserInputError(f"{path}: --seq-len must be a positive integer, got {seq_len!r}")
    resolved = {**args, "task": task.value, "seq_len": seq_len}
    if repo_id or hub:
        resolved["hub"] = repo_id or hub
    return ConfigModel(path=path, config=config, task=task, seq_len=seq_len, args=resolved)


def config_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_config(path: Path, overrides: dict[str, Any]) -> Any:
    """transformers' config class for the file (by its ``model_type``), overrides applied,
    set up for a training forward: no KV cache, torch's fused attention where supported."""
    from transformers import AutoConfig

    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"{path}: not a readable JSON config: {_one_line(exc)}") from exc
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise UserInputError(
            f"{path}: a Hugging Face config.json names its model_type; this one does not"
        )
    try:
        config = AutoConfig.for_model(**raw)
    except Exception as exc:  # unknown model_type, or values the config class rejects
        raise UserInputError(
            f"{path}: transformers {_version()} cannot read this config "
            f"(model_type {raw['model_type']!r}): {_one_line(exc)}"
        ) from exc
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise UserInputError(
                f"{path}: --model-arg {key}: the {type(config).__name__} has no such field"
            )
        setattr(config, key, value)
    for sub in {id(c): c for c in (config, config.get_text_config())}.values():
        sub.use_cache = False
    config._attn_implementation = "sdpa" if _supports_sdpa(config) else "eager"
    return config


def _supports_sdpa(config: Any) -> bool:
    import transformers

    names = config.architectures or []
    cls = next((getattr(transformers, n, None) for n in names if hasattr(transformers, n)), None)
    return bool(getattr(cls, "_supports_sdpa", True)) if cls is not None else True


def choose_task(config: Any, requested: str | None, path: Path) -> Task:
    """``--task`` if given, else the task whose Auto mapping lists the config's architecture,
    else (no ``architectures``) the first task whose mapping has its model type."""
    from transformers.models.auto import modeling_auto

    mappings = {t: getattr(modeling_auto, m) for t, (_, m) in AUTO_CLASSES.items()}
    if requested:
        try:
            task = Task(requested)
        except ValueError:
            raise UserInputError(f"--task {requested!r} is not one of {', '.join(TASKS)}") from None
        if config.model_type not in mappings[task]:
            raise UserInputError(
                f"{path}: transformers has no {task} model for model_type "
                f"{config.model_type!r}: choose another --task"
            )
        return task
    for arch in config.architectures or []:
        for task, mapping in mappings.items():
            if arch in _names(mapping.get(config.model_type)):
                return task
    for task, mapping in mappings.items():
        if not config.architectures and config.model_type in mapping:
            return task
    named = ", ".join(config.architectures or []) or f"model_type {config.model_type}"
    raise UserInputError(
        f"{path}: no training task known for {named}: pass --task one of {', '.join(TASKS)}"
    )


def _names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def default_seq_len(config: Any, task: Task, path: Path) -> int:
    """The config's context, capped at ``MAX_DEFAULT_SEQ_LEN``; a decoder's for speech; one
    second of audio for an audio classifier; the patch count is the config's for images."""
    if task is Task.AUDIO_CLASSIFICATION:
        return AUDIO_SAMPLES
    if task is Task.IMAGE_CLASSIFICATION:
        return 1  # unused: the image size comes from the config
    if task is Task.SPEECH_SEQ2SEQ:
        return min(int(config.max_target_positions), MAX_DEFAULT_SEQ_LEN)
    text = config.get_text_config()
    for key in CONTEXT_KEYS:
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            if text.model_type in PADDING_OFFSET_POSITIONS:
                value -= (text.pad_token_id or 0) + 1
            return min(value, MAX_DEFAULT_SEQ_LEN)
    if getattr(text, "relative_attention_num_buckets", None):
        return RELATIVE_POSITION_SEQ_LEN
    raise UserInputError(f"{path}: the config names no context length: pass --seq-len N")


def vocab_size(config: Any) -> int:
    return int(config.get_text_config().vocab_size)


def image_shape(config: Any) -> tuple[int, int, int]:
    """(channels, height, width) of the config's images."""
    size = getattr(config, "image_size", None) or DEFAULT_IMAGE_SIZE
    height, width = (size, size) if isinstance(size, int) else tuple(size)[:2]
    return int(getattr(config, "num_channels", 3)), int(height), int(width)


def _version() -> str:
    import transformers

    return transformers.__version__


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("…" if len(text) > 300 else "")


def apply_config_flags(args: Any, model_args: dict[str, Any]) -> dict[str, Any]:
    """The command line's part for a config source: ``--task`` and ``--seq-len`` join the
    model args, the report directory defaults to the model's name (not ``config``), and
    ``--run`` says that it trains on synthetic data. For a model file, ``--task`` and
    ``--seq-len`` are an error (its ``make_batch`` decides its inputs)."""
    given = {"task": args.task, "seq_len": args.seq_len}
    if not is_config_source(args.model):
        flag = next((k for k, v in given.items() if v is not None), None)
        if flag:
            raise UserInputError(
                f"--{flag.replace('_', '-')} is for a Hugging Face config (hf:ORG/NAME or a "
                "config.json); a model file's make_batch decides its own inputs"
            )
        return model_args
    if args.out is None:
        args.out = str(Path("reports") / source_name(args.model))
    if getattr(args, "run", False) and not getattr(args, "quiet", False):
        import sys

        print(
            f"note: {source_name(args.model)} trains on synthetic data (random inputs and "
            "labels, seeded by the step): the run measures speed and memory, not learning",
            file=sys.stderr,
        )
    return {**model_args, **{k: v for k, v in given.items() if v is not None}}
