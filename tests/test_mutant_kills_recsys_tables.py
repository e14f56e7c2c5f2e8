"""Tests written for mutmut's generated mutants of planner/recsys/tables.py (reading a TorchRec
model file into table blocks and a dense part, benchmarks/generated_mutants.py). The model files
are written here, small enough that every figure read from them is worked out by hand below
(rows, widths, features, pooling factors, the dense part's parameters, products and ops), and
each bad file is refused by its whole one-line message. docs/mutation.md names the mutants each
test kills."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchrec  # noqa: F401  (no skip: the README's test command installs the recsys extra)

from planner.errors import UserInputError
from planner.modelfile import load_model_file
from planner.recsys.tables import (
    STATS_SAMPLE,
    TableBlock,
    dense_op_counts,
    meta_model,
    read_model,
    uses_torchrec,
    with_dense_ops,
)

# Two EmbeddingBagCollections, one at the top (table "ab": 10 rows of 4, features a and b; an
# EBC subclass with a 4 x 4 gate Linear of its own) and one inside ``sub`` (table "u": 5 rows
# of 2, feature c). Outside them: sub.proj Linear(6, 3) (21 parameters), ebc_mix Linear(2, 2)
# (6; its name begins with the EBC's, not with "ebc."), a frozen scale (3, not trained) and a
# bias-free side Linear(5, 1) (5). Each make_batch sample has 1 id of a, 3 of b and 2 of c.
HEAD = """
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class GatedEBC(EmbeddingBagCollection):
    def __init__(self, tables):
        super().__init__(tables=tables)
        self.gate = torch.nn.Linear(4, 4)


class Sub(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="u", embedding_dim=2, num_embeddings=5, feature_names=["c"]),
        ])
        self.proj = torch.nn.Linear(6, 3)


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = GatedEBC([
            EmbeddingBagConfig(name="ab", embedding_dim=4, num_embeddings=10,
                               feature_names=["a", "b"]),
        ])
        self.sub = Sub()
        self.ebc_mix = torch.nn.Linear(2, 2)
        self.side = torch.nn.Linear(5, 1, bias=False)
        self.scale = torch.nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, dense, sparse):
        pooled = torch.cat([self.ebc(sparse).values(), self.sub.ebc(sparse).values()], dim=1)
        out = self.sub.proj(pooled[:, :6] + dense)
        return (out EXTRA).sum(1)


def build_model():
    return M()


def make_batch(batch_size, step=0):
    lengths = torch.tensor([1] * batch_size + [3] * batch_size + [2] * batch_size)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b", "c"], values=torch.zeros(int(lengths.sum()), dtype=torch.long),
        lengths=lengths)
    return (torch.zeros(batch_size, 6), kjt), torch.zeros(batch_size)


def loss_fn(out, y):
    return torch.nn.functional.mse_loss(out, y)
"""
TABLES = [
    TableBlock("ab", "ebc", ("a", "b"), 10, 4, 4.0, 0.0),
    TableBlock("u", "sub.ebc", ("c",), 5, 2, 2.0, 0.0),
]
MEASURED = (
    f"pooling factors measured on make_batch({STATS_SAMPLE}); ids priced as uniform (define "
    "embedding_stats() in the model file to give their skew)"
)


def _file(tmp_path: Path, tail: str = "", extra: str = "", name: str = "rec.py"):
    path = tmp_path / name
    path.write_text(HEAD.replace("EXTRA", extra) + tail)
    return load_model_file(path)


def test_tables_and_the_dense_part_are_read_by_hand(tmp_path):
    """Without embedding_stats() the pooling factor is each table's features' mean ids per
    sample on make_batch (ab: 1 + 3, u: 2), the ids uniform. The dense part: proj (6 x 3 + 3),
    ebc_mix (2 x 2 + 2) and side (5) are trained, 32 parameters in 5 tensors; the gate is the
    EBC's and the scale frozen. FLOPs 2 (6 x 3 + 2 x 2 + 5 x 1) = 54 per sample, activations
    (6 + 3) + (2 + 2) + (5 + 1) = 19. ZeRO-3's unit: the largest child's trained parameters,
    sub's 21 (ebc 0, ebc_mix 6, side 5)."""
    rec = read_model(_file(tmp_path))
    assert rec.tables == TABLES
    assert [t.elements for t in rec.tables] == [40, 10]
    assert rec.embedding_params == 50
    assert (rec.dense_params, rec.dense_tensors) == (32, 5)
    assert rec.dense_flops_per_sample == 54.0
    assert rec.dense_activations_per_sample == 19.0
    assert rec.dense_unit_params == 21
    assert rec.notes == [MEASURED]
    assert (rec.dense_forward_ops, rec.dense_backward_ops) == (0, 0)


STATS = """
def embedding_stats():
    return {"ab": {"pooling_factor": 2, "zipf": 1.25}, "u": {"pooling_factor": 0.5}}


def make_batch(batch_size, step=0):
    raise RuntimeError("embedding_stats() is given: no batch is read")
"""


def test_given_stats_are_read_as_floats_with_uniform_ids_by_default(tmp_path):
    """embedding_stats() wins over the batch (never called here); an integer pooling factor is
    read as a float, a missing zipf as 0 (uniform); no note."""
    rec = read_model(_file(tmp_path, STATS))
    got = [(t.name, t.pooling_factor, t.zipf) for t in rec.tables]
    assert got == [("ab", 2.0, 1.25), ("u", 0.5, 0.0)]
    assert all(type(t.pooling_factor) is float and type(t.zipf) is float for t in rec.tables)
    assert rec.notes == []


U = '"u": {"pooling_factor": 1}}'  # the second table's entry, closing the dict


def _stats(body: str) -> str:
    return f"\ndef embedding_stats():\n    {body}\n"


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (
            _stats('raise KeyError("ab")'),
            "rec.py: embedding_stats() raised KeyError: 'ab'",
        ),
        (
            _stats('return {"ab": {"pooling_factor": 1.0}}'),
            "rec.py: embedding_stats() has no entry for table 'u' (expected "
            "{'pooling_factor': L, 'zipf': s} per table)",
        ),
        (
            _stats('return [{"pooling_factor": 1.0}]'),
            "rec.py: embedding_stats() has no entry for table 'ab' (expected "
            "{'pooling_factor': L, 'zipf': s} per table)",
        ),
        (
            _stats('return {"ab": 1.0, "u": {}}'),
            "rec.py: embedding_stats() has no entry for table 'ab' (expected "
            "{'pooling_factor': L, 'zipf': s} per table)",
        ),
        (
            _stats('return {"ab": {"pooling_factor": 1.0}, "u": {"zipf": 1.0}}'),
            "rec.py: embedding_stats()['u']['pooling_factor'] must be a number >= 0, got None",
        ),
        (
            _stats('return {"ab": {"pooling_factor": True}, "u": {"pooling_factor": 1}}'),
            "rec.py: embedding_stats()['ab']['pooling_factor'] must be a number >= 0, got True",
        ),
        (
            _stats('return {"ab": {"pooling_factor": "2"}, "u": {"pooling_factor": 1}}'),
            "rec.py: embedding_stats()['ab']['pooling_factor'] must be a number >= 0, got '2'",
        ),
        (
            _stats('return {"ab": {"pooling_factor": 1, "zipf": -0.5}, ' + U),
            "rec.py: embedding_stats()['ab']['zipf'] must be a number >= 0, got -0.5",
        ),
        (
            _stats('return {"ab": {"pooling_factor": 1, "zipf": False}, ' + U),
            "rec.py: embedding_stats()['ab']['zipf'] must be a number >= 0, got False",
        ),
        (
            "\ndef make_batch(batch_size, step=0):\n    return (torch.zeros(batch_size, 6),), 0\n",
            "rec.py: make_batch's inputs hold no KeyedJaggedTensor and the file has no "
            "embedding_stats(): give one of them",
        ),
        (
            "\ndef make_batch(batch_size, step=0):\n    raise ValueError(f'no {batch_size}')\n",
            f"rec.py: make_batch({STATS_SAMPLE}) raised ValueError: no {STATS_SAMPLE}",
        ),
    ],
)
def test_each_bad_stats_or_batch_is_refused_by_its_own_line(tmp_path, tail, message):
    with pytest.raises(UserInputError) as err:
        read_model(_file(tmp_path, tail))
    assert str(err.value) == message


def test_stats_of_zero_are_accepted(tmp_path):
    """0 is a valid pooling factor and Zipf exponent (the check is >= 0)."""
    body = 'return {"ab": {"pooling_factor": 0, "zipf": 0}, "u": {"pooling_factor": 0.0}}'
    rec = read_model(_file(tmp_path, _stats(body)))
    assert [(t.pooling_factor, t.zipf) for t in rec.tables] == [(0.0, 0.0), (0.0, 0.0)]


def test_a_batch_given_as_one_kjt_not_a_tuple_is_read(tmp_path):
    """make_batch may return its one input bare; each sample has 2 ids of a, none of b or c."""
    tail = (
        "\ndef make_batch(batch_size, step=0):\n"
        "    lengths = torch.tensor([2] * batch_size + [0] * (2 * batch_size))\n"
        "    kjt = KeyedJaggedTensor.from_lengths_sync(keys=['a', 'b', 'c'],\n"
        "        values=torch.zeros(2 * batch_size, dtype=torch.long), lengths=lengths)\n"
        "    return kjt, None\n"
    )
    rec = read_model(_file(tmp_path, tail))
    assert [t.pooling_factor for t in rec.tables] == [2.0, 0.0]


def test_a_model_without_an_ebc_is_refused_and_is_no_recommendation_model(tmp_path):
    """A file naming torchrec whose model holds no EmbeddingBagCollection; a file not naming it
    is never executed (its build would raise)."""
    mf = _file(tmp_path, "\ndef build_model():\n    return torch.nn.Linear(2, 2)\n")
    assert uses_torchrec(mf) is False
    with pytest.raises(UserInputError) as err:
        read_model(mf)
    assert str(err.value) == "rec.py: the model holds no TorchRec EmbeddingBagCollection"
    plain = tmp_path / "plain.py"
    plain.write_text(
        "def build_model():\n    raise RuntimeError('executed')\n\n"
        "def make_batch(batch_size, step=0):\n    raise RuntimeError('executed')\n"
    )
    assert uses_torchrec(load_model_file(plain)) is False
    assert uses_torchrec(_file(tmp_path)) is True


def test_the_meta_model_is_built_once_on_meta_with_the_initializers_restored(tmp_path):
    """One meta model per loaded file; torch.nn.init's in-place initializers are put back."""
    before = torch.nn.init.normal_
    mf = _file(tmp_path)
    model = meta_model(mf)
    assert meta_model(mf) is model
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert torch.nn.init.normal_ is before
    w = torch.zeros(3)
    torch.nn.init.constant_(w, 2.0)
    assert w.tolist() == [2.0, 2.0, 2.0]


def test_the_dense_ops_grow_by_what_one_more_op_costs_each_way(tmp_path):
    """Forward: the cat, the add, proj's addmm and the sum are 4 eager ops (the slice, the
    transpose and the EBCs' stand-ins dispatch none). A ``* 2.0`` more adds one op forward
    (mul) and one backward (the gradient's mul by 2); ``* 2.0 + 1.0``, two forward and still
    one backward (an add passes its gradient through)."""
    counts = {}
    for name, extra in (("base", ""), ("mul", "* 2.0"), ("muladd", "* 2.0 + 1.0")):
        counts[name] = dense_op_counts(_file(tmp_path, extra=extra, name=f"{name}.py"))
    fwd, bwd = counts["base"]
    assert fwd == 4
    assert bwd > 0
    assert counts["mul"] == (fwd + 1, bwd + 1)
    assert counts["muladd"] == (fwd + 2, bwd + 1)
    rec = with_dense_ops(_file(tmp_path, name="again.py"), read_model(_file(tmp_path)))
    assert (rec.dense_forward_ops, rec.dense_backward_ops) == (fwd, bwd)
    assert rec.tables == TABLES


def test_a_model_whose_output_needs_no_gradient_has_no_backward_ops(tmp_path):
    """An output detached from the graph: its forward ops counted (4, and the detach is a
    view), no backward; glue the pooled stand-in does not satisfy: nothing priced."""
    assert dense_op_counts(_file(tmp_path, extra=".detach()", name="d.py")) == (4, 0)
    assert dense_op_counts(_file(tmp_path, extra="[:, :99].reshape(7)", name="e.py")) == (0, 0)


def _variant(forward: str, batch: str = "(dense, kjt)") -> str:
    """A tail making the model ``M`` with ``forward`` (the body of ``forward(self, *inputs)``,
    its inputs named by ``batch``) and make_batch returning ``batch``'s inputs."""
    return f"""
class Variant(M):
    def forward(self, {batch.strip("(),").replace("kjt", "sparse").replace("2.0", "_2")}):
{forward}


def build_model():
    return Variant()


_made = make_batch


def make_batch(batch_size, step=0):
    (dense, kjt), y = _made(batch_size, step)
    temp, dense1 = torch.tensor(2.0), dense[:, 0]
    return {batch}, y
"""


POOLED = "torch.cat([self.ebc(sparse).values(), self.sub.ebc(sparse).values()], dim=1)"


@pytest.mark.parametrize(
    ("batch", "forward", "expected"),
    [
        # the model's own forward, its inputs in another order: the KJT first, or a scalar
        ("(kjt, dense)", "        return M.forward(self, dense, sparse)", "base"),
        ("(temp, dense, kjt)", "        return M.forward(self, dense, sparse)", "base"),
        # only a 1-D tensor gives the batch: the stand-in's rows must agree with it (two cats
        # and a sum; the cats' backward slices, not counted by hand here)
        ("(dense1, kjt)", f"        return torch.cat([{POOLED}, dense1[:, None]], 1).sum(1)",
         (3, None)),
        # the pooled embeddings read by feature: a KeyedTensor keyed as the EBC's features
        # (its split into features is views: the cat, add, addmm and sum forward)
        ("(dense, kjt)",
         "        d = self.ebc(sparse).to_dict()\n"
         "        return self.sub.proj(torch.cat([d['a'], d['b']], 1)[:, :6] + dense).sum(1)",
         (4, None)),
        # nothing dense: the gradient still flows back into the pooled embeddings (trained)
        ("(dense, kjt)", "        return (self.ebc(sparse).values() * 2.0).sum(1)", (2, 2)),
        # a Python number among the inputs (a scale): one mul more each way
        ("(dense, kjt, 2.0)", "        return M.forward(self, dense, sparse) * _2",
         lambda f, b: (f + 1, b + 1)),
        # outputs in a tuple: the forward's ops, and no loss to run backward from
        ("(dense, kjt)", "        return (M.forward(self, dense, sparse),)",
         lambda f, b: (f, 0)),
        # a round trip through fp64 (the input needs no gradient): two copies forward, each
        # to its dtype (a copy without its dtype keeps fp32, and .float() is then no op)
        ("(dense, kjt)", "        return M.forward(self, dense.double().float(), sparse)",
         lambda f, b: (f + 2, b)),
    ],
    ids=["kjt-first", "scalar-first", "only-1d", "to-dict", "nothing-dense", "python-scale",
         "tuple-output", "fp64-round-trip"],
)  # fmt: skip
def test_the_pooled_stand_in_has_the_batchs_rows_each_features_key_and_a_gradient(
    tmp_path, batch, forward, expected
):
    base = dense_op_counts(_file(tmp_path, name="base.py"))
    got = dense_op_counts(_file(tmp_path, _variant(forward, batch), name="variant.py"))
    if expected == "base":
        assert got == base
    elif callable(expected):
        assert got == expected(*base)
    else:  # the forward ops by hand; the backward's where counted by hand, else some
        assert got[0] == expected[0]
        assert got[1] == expected[1] if expected[1] is not None else got[1] > 0


def test_the_batch_is_read_at_step_0(tmp_path):
    """make_batch is asked for step 0 by name (a file may give ``step`` no default): here each
    sample has 1 + step ids of a, so ab's pooling factor is 1 + 3 at step 0."""
    tail = (
        "\ndef make_batch(batch_size, step):\n"
        "    b = batch_size\n"
        "    lengths = torch.tensor([1 + step] * b + [3] * b + [2] * b)\n"
        "    kjt = KeyedJaggedTensor.from_lengths_sync(keys=['a', 'b', 'c'],\n"
        "        values=torch.zeros(int(lengths.sum()), dtype=torch.long), lengths=lengths)\n"
        "    return (torch.zeros(batch_size, 6), kjt), None\n"
    )
    assert [t.pooling_factor for t in read_model(_file(tmp_path, tail)).tables] == [4.0, 2.0]


def test_counting_the_dense_ops_leaves_the_meta_model_as_it_was(tmp_path):
    """The EBCs answer with their own forward again, and no parameter keeps a gradient."""
    mf = _file(tmp_path)
    dense_op_counts(mf)
    model = meta_model(mf)
    for ebc in (model.ebc, model.sub.ebc):
        assert ebc.forward.__func__ is type(ebc).forward
    assert all(p.grad is None for p in model.parameters())


def test_the_kjt_is_found_among_other_inputs_and_a_feature_it_lacks_has_no_ids(tmp_path):
    """make_batch's inputs: a dict of side features (it has keys, no lengths) before the KJT,
    which carries a (1 id a sample) and b (3) but not c: u's pooling factor is 0."""
    tail = (
        "\ndef make_batch(batch_size, step=0):\n"
        "    lengths = torch.tensor([1] * batch_size + [3] * batch_size)\n"
        "    kjt = KeyedJaggedTensor.from_lengths_sync(keys=['a', 'b'],\n"
        "        values=torch.zeros(4 * batch_size, dtype=torch.long), lengths=lengths)\n"
        "    return ({'side': torch.zeros(batch_size)}, kjt), None\n"
    )
    assert [t.pooling_factor for t in read_model(_file(tmp_path, tail)).tables] == [4.0, 0.0]


def test_the_model_file_is_imported_off_the_meta_device(tmp_path):
    """The file (its module-level tensors: here the ids per sample of a, b and c) is imported
    before the meta model is built on the meta device, so make_batch's lengths are real."""
    tail = (
        "\nIDS = torch.tensor([1, 3, 2])\n\n\n"
        "def make_batch(batch_size, step=0):\n"
        "    lengths = IDS.repeat_interleave(batch_size)\n"
        "    kjt = KeyedJaggedTensor.from_lengths_sync(keys=['a', 'b', 'c'],\n"
        "        values=torch.zeros(int(lengths.sum()), dtype=torch.long), lengths=lengths)\n"
        "    return (torch.zeros(batch_size, 6), kjt), None\n"
    )
    assert [t.pooling_factor for t in read_model(_file(tmp_path, tail)).tables] == [4.0, 2.0]


def test_a_model_fed_only_its_kjt_counts_the_ops_of_its_batch(tmp_path):
    """No input tensor gives the batch: the KJT's stride does (make_batch's 256 samples), and
    the counts are those of the same model given the batch by a tensor it does not read (a
    cat, a mul and a sum forward). The stand-in once had one row there, where the backward's
    layout copies are not dispatched: 2 backward ops counted for 6."""
    forward = f"        return ({POOLED} * 2.0).sum(1)"
    only = dense_op_counts(_file(tmp_path, _variant(forward, "(kjt,)"), name="only.py"))
    given = dense_op_counts(_file(tmp_path, _variant(forward, "(dense1, kjt)"), name="given.py"))
    assert only[0] == 3
    assert only == given
