"""rmsnorm.torch: the custom ops, their autograd and torch.compile, against torch.

Every expected value comes from torch: ``torch.nn.functional.rms_norm`` and
torch autograd on the same tensors, the unreplaced ``torch.nn.RMSNorm``, or
torch's own checkers (gradcheck, opcheck). Forward results use
torch.testing.assert_close's default tolerances for the dtype; gradients use
the parity suite's tolerance scaled to the tensor (closeness.grad_tolerance).
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from closeness import assert_close_ulp
from test_import import run_python
from supported_dtypes import LOOP_PAIR_NAMES
from test_parity_torch import EPSILONS, SHAPE_CASES, eps_id, make_inputs, shape_case_id

import rmsnorm
import rmsnorm.torch as rt

F = torch.nn.functional

# torch.testing.assert_close's default (rtol, atol) per dtype.
DEFAULT_TOLERANCE = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def assert_matches(actual, expected, *, what, gradient=False):
    """actual against torch's expected, in expected's dtype's default
    tolerances (atol scaled to the tensor for a gradient, as in the parity
    suite); a failure names the worst element and its ULP distance."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    rtol, atol = DEFAULT_TOLERANCE[expected.dtype]
    as_numpy = torch.float64 if expected.dtype == torch.float64 else torch.float32
    actual_np = actual.detach().to(as_numpy).numpy()
    expected_np = expected.detach().to(as_numpy).numpy()
    if gradient and expected_np.size:
        finite = expected_np[np.isfinite(expected_np)]
        atol *= max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
    assert_close_ulp(actual_np, expected_np, rtol=rtol, atol=atol, what=what, check_dtype=False)


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def torch_and_ours(call_ours, x, weight, grad_output, normalized_shape, eps):
    """(ours, torch's) as (y, grad_input, grad_weight), each through autograd."""
    results = []
    for call in (call_ours, lambda x, s, w, e: F.rms_norm(x, s, w, e)):
        x_leaf, w_leaf = leaves(x, weight)
        y = call(x_leaf, list(normalized_shape), w_leaf, eps)
        y.backward(grad_output)
        results.append((y, x_leaf.grad, None if w_leaf is None else w_leaf.grad))
    return results


def through_function(x, shape, weight, eps):
    return rt.rms_norm(x, shape, weight, eps)


def through_op(x, shape, weight, eps):
    return torch.ops.rmsnorm.rms_norm(x, shape, weight, eps, 0.0)


PATHS = {"function": through_function, "op": through_op}


def check_against_torch(path, x, weight, grad_output, normalized_shape, eps):
    ours, theirs = torch_and_ours(PATHS[path], x, weight, grad_output, normalized_shape, eps)
    assert_matches(ours[0], theirs[0], what="output")
    assert_matches(ours[1], theirs[1], what="grad_input", gradient=True)
    if weight is None:
        assert ours[2] is None
    else:
        assert_matches(ours[2], theirs[2], what="grad_weight", gradient=True)


# ---------------------------------------------------------------------------
# Parity over the NumPy suite's grid, through the eager function and the op.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, dtype, case, eps, affine",
    [
        pytest.param(
            path,
            dtype,
            case,
            eps,
            affine,
            id=f"{path}-{str(dtype)[6:]}-{shape_case_id(case)}-{eps_id(eps)}-"
            f"{'affine' if affine else 'no_weight'}",
        )
        for path in PATHS
        for dtype in (torch.float32, torch.float64)
        for case in SHAPE_CASES
        for eps in EPSILONS
        for affine in (True, False)
    ],
)
def test_output_and_grads_match_torch_autograd(path, dtype, case, eps, affine):
    shape, normalized_shape = case
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    x, weight, grad_output = (
        torch.from_numpy(a) for a in make_inputs(shape, normalized_shape, np_dtype, eps)
    )
    check_against_torch(path, x, weight if affine else None, grad_output, normalized_shape, eps)


# Every loop's (input, weight) but float32 with its own weight, which
# test_output_and_grads_match_torch_autograd runs above. torch has bfloat16
# itself: its loops are here with or without ml_dtypes.
DTYPE_PAIRS = [(getattr(torch, x), getattr(torch, weight)) for x, weight in LOOP_PAIR_NAMES
               if (x, weight) != ("float32", "float32")]


def pair_id(pair):
    return f"{str(pair[0])[6:]}-weight_{str(pair[1])[6:]}"


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("pair", DTYPE_PAIRS, ids=pair_id)
@pytest.mark.parametrize(
    "case", [((5, 7), (7,)), ((3, 4096), (4096,)), ((2, 3, 127), (3, 127))], ids=shape_case_id
)
@pytest.mark.parametrize("eps", [None, 1e-5], ids=eps_id)
# torch's reference, given a weight of another dtype than the input, warns
# that it leaves its fused kernel for the composite one: expected here.
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
def test_dtype_pairs_match_torch_autograd(path, pair, case, eps):
    shape, normalized_shape = case
    x, weight, grad_output = (
        torch.from_numpy(a) for a in make_inputs(shape, normalized_shape, np.float64, eps)
    )
    x, grad_output, weight = x.to(pair[0]), grad_output.to(pair[0]), weight.to(pair[1])
    check_against_torch(path, x, weight, grad_output, normalized_shape, eps)


def test_bfloat16_needs_no_ml_dtypes():
    # The torch path reads bfloat16 memory directly, never as a NumPy array;
    # in a process without ml_dtypes the same call must work.
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import torch, rmsnorm.torch as rt\n"
        "x = torch.randn(4, 64, dtype=torch.bfloat16); w = torch.rand(64, dtype=torch.bfloat16)\n"
        "y = rt.rms_norm(x, [64], w)\n"
        "torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, [64], w))\n"
        "print('ok')\n"
    )
    result = run_python(code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# ---------------------------------------------------------------------------
# Layouts: non-contiguous tensors, read where they are or folded by a copy.
# ---------------------------------------------------------------------------

LAYOUTS = {
    "transposed": lambda t: t.t().contiguous().t(),
    "column_slice": lambda t: torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype).index_copy_(
        1, torch.arange(0, 2 * t.shape[1], 2), t
    )[:, ::2],
    "row_slice": lambda t: torch.zeros(2 * t.shape[0], t.shape[1], dtype=t.dtype).index_copy_(
        0, torch.arange(0, 2 * t.shape[0], 2), t
    )[::2],
    "broadcast": lambda t: t[:1].expand(t.shape),
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_tensors_match_torch(path, layout, dtype):
    x, weight, grad_output = (
        torch.from_numpy(a).to(dtype)
        for a in make_inputs((6, 33), (33,), np.float64, 1e-5, seed=1)
    )
    x, grad_output = LAYOUTS[layout](x), LAYOUTS[layout](grad_output)
    assert not x.is_contiguous()
    strided_weight = LAYOUTS["column_slice"](weight[None, :])[0]
    assert not strided_weight.is_contiguous()
    check_against_torch(path, x, strided_weight, grad_output, (33,), 1e-5)


@pytest.mark.parametrize("path", list(PATHS))
def test_permuted_input_over_two_dims_matches_torch(path):
    # (3, 4, 5) as a view of (5, 4, 3): its normalised dims fold only by a copy.
    x, weight, grad_output = (
        torch.from_numpy(a) for a in make_inputs((3, 4, 5), (4, 5), np.float32, 1e-6, seed=3)
    )
    x = x.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    check_against_torch(path, x, weight, grad_output, (4, 5), 1e-6)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_transposed_heads_match_torch(path, dtype):
    # A q/k norm's input: (batch, heads, tokens, head_dim) as a transposed
    # view of (batch, tokens, heads, head_dim) memory.
    x, weight, grad_output = (
        torch.from_numpy(a).to(dtype)
        for a in make_inputs((2, 5, 3, 16), (16,), np.float64, 1e-6, seed=4)
    )
    x, grad_output = x.transpose(1, 2), grad_output.transpose(1, 2)
    check_against_torch(path, x, weight, grad_output, (16,), 1e-6)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_eager_calls_read_transposed_heads_in_place_and_keep_their_layout(
    requires_grad, monkeypatch
):
    # Rows contiguous in another order of the batch dims need no copy: the
    # eager output is laid out as the input, as torch's elementwise ops lay
    # theirs; the op's output is contiguous, as its fake implementation says.
    x = torch.randn(2, 7, 4, 32).transpose(1, 2).requires_grad_(requires_grad)
    weight = torch.rand(32)
    expected = torch.ops.rmsnorm.rms_norm(x.detach(), [32], weight, 1e-6, 0.0)
    assert expected.is_contiguous()

    def refuse(tensor, *args):
        raise AssertionError("the input was folded by a copy")

    monkeypatch.setattr(rt, "_operand", refuse)
    y = rt.rms_norm(x, [32], weight, 1e-6)
    assert y.stride() == x.stride() and torch.equal(y, expected)


def test_contiguous_operands_are_read_in_place():
    # Zero copies of the input's size: the kernels get the tensors' own
    # addresses, for a contiguous tensor and for a view whose rows fold.
    x = torch.randn(8, 4, 16)
    held, argument = rt._operand(x, 32, 16)
    assert held is x and argument == x.data_ptr()
    rows_view = torch.randn(16, 16)[::2]  # rows 2 apart: strides (32, 1)
    held, argument = rt._operand(rows_view, 8, 16)
    assert argument == (rows_view.data_ptr(), 32 * 4, 4)


# ---------------------------------------------------------------------------
# The eager shortcuts give the op's bytes; threads change no byte.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("pair", DTYPE_PAIRS, ids=pair_id)
def test_no_grad_shortcut_gives_the_ops_bytes(pair):
    x = torch.randn(5, 300, dtype=pair[0])
    weight = torch.rand(300, dtype=pair[1])
    with torch.no_grad():
        shortcut = rt.rms_norm(x, 300, weight, 1e-6)
    op = torch.ops.rmsnorm.rms_norm(x, [300], weight, 1e-6, 0.0)
    assert torch.equal(shortcut, op)


def test_eager_module_calls_skip_the_dispatcher(monkeypatch):
    # A module's weight is a Parameter, a tensor no tracer stands behind: its
    # eager calls take the shortcuts, with and without autograd.
    def refuse(*args):
        raise AssertionError("an eager call went through the op")

    monkeypatch.setattr(rt, "_rms_norm_op", refuse)
    layer = rt.RMSNorm(16)
    x = torch.randn(2, 16)
    with torch.no_grad():
        layer(x)
    layer(x.requires_grad_()).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_results_are_the_same_bytes_for_any_thread_count(restore_num_threads):
    # 512 rows of 4096: past the size where the kernels split work among threads.
    x, weight, grad_output = torch.randn(512, 4096), torch.rand(4096), torch.randn(512, 4096)
    results, torch_threads = [], torch.get_num_threads()
    for threads in (1, 2, 3, 8):
        rmsnorm.set_num_threads(threads)
        torch.set_num_threads(max(1, threads // 2))
        x_leaf, w_leaf = leaves(x, weight)
        y = rt.rms_norm(x_leaf, [4096], w_leaf)
        y.backward(grad_output)
        results.append((y.detach(), x_leaf.grad, w_leaf.grad))
    torch.set_num_threads(torch_threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


# ---------------------------------------------------------------------------
# The fused residual add and the weight offset.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["function", "op"])
@pytest.mark.parametrize(
    "pair",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float64, torch.float64),
    ],
    ids=pair_id,
)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
def test_add_rms_norm_matches_torch_add_then_rms_norm(path, pair, affine):
    dtype, weight_dtype = pair
    x, residual, grad_y, grad_h = (
        torch.randn(3, 5, 96, dtype=torch.float64).to(dtype) for _ in range(4)
    )
    weight = torch.rand(96, dtype=torch.float64).to(weight_dtype) if affine else None
    x_leaf, r_leaf, w_leaf = leaves(x, residual, weight)
    if path == "function":
        y, h = rt.add_rms_norm(x_leaf, r_leaf, [96], w_leaf, 1e-6)
    else:
        y, h = torch.ops.rmsnorm.add_rms_norm(x_leaf, r_leaf, [96], w_leaf, 1e-6, 0.0)
    torch.autograd.backward((y, h), (grad_y, grad_h))
    # torch in float64 from the sum as torch's add rounds it: torch's own
    # 16-bit gradient rounds the norm's part before adding grad_h to it.
    h_t = (x + residual).double().requires_grad_()
    (w_t,) = leaves(None if weight is None else weight.double())
    y_t = F.rms_norm(h_t, [96], w_t, 1e-6)
    torch.autograd.backward((y_t, h_t), (grad_y.double(), grad_h.double()))
    assert torch.equal(h.detach(), x + residual)  # one rounding of the sum, as torch's add
    assert_matches(y, y_t.to(dtype), what="output")
    assert_matches(x_leaf.grad, h_t.grad.to(dtype), what="grad of x", gradient=True)
    assert_matches(r_leaf.grad, h_t.grad.to(dtype), what="grad of residual", gradient=True)
    if affine:
        assert_matches(w_leaf.grad, w_t.grad.to(weight_dtype), what="grad_weight", gradient=True)


@pytest.mark.parametrize("path", ["function", "op"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_weight_offset_matches_torch_with_one_plus_weight(path, dtype):
    x, grad_output = torch.randn(4, 128).to(dtype), torch.randn(4, 128).to(dtype)
    weight = (0.1 * torch.randn(128)).to(dtype)  # Gemma's weights sit near 0
    x_leaf, w_leaf = leaves(x, weight)
    if path == "function":
        y = rt.rms_norm(x_leaf, 128, w_leaf, 1e-6, weight_offset=1.0)
    else:
        y = torch.ops.rmsnorm.rms_norm(x_leaf, [128], w_leaf, 1e-6, 1.0)
    y.backward(grad_output)
    # torch in float64, rounded to the dtype: our factor 1 + weight is exact too.
    x_t, w_t = leaves(x.double(), weight.double())
    y_t = F.rms_norm(x_t, [128], 1.0 + w_t, 1e-6)
    y_t.backward(grad_output.double())
    assert_matches(y, y_t.to(dtype), what="output")
    assert_matches(x_leaf.grad, x_t.grad.to(dtype), what="grad_input", gradient=True)
    assert_matches(w_leaf.grad, w_t.grad.to(dtype), what="grad_weight", gradient=True)


def test_weight_offset_without_weight_is_an_error():
    with pytest.raises(ValueError, match="needs a weight"):
        rt.rms_norm(torch.randn(2, 8), 8, None, weight_offset=1.0)


# ---------------------------------------------------------------------------
# torch's checkers: gradcheck, second order, opcheck.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
def test_gradcheck(affine, weight_offset):
    if weight_offset and not affine:
        pytest.skip("an offset needs a weight")
    x = torch.randn(3, 2, 7, dtype=torch.float64, requires_grad=True)
    residual = torch.randn(3, 2, 7, dtype=torch.float64, requires_grad=True)
    weight = torch.rand(2, 7, dtype=torch.float64, requires_grad=True) if affine else None
    inputs = (x, weight) if affine else (x,)

    def norm(x, weight=None):
        return rt.rms_norm(x, (2, 7), weight, 1e-5, weight_offset=weight_offset)

    def add_norm(x, residual, weight=None):
        return rt.add_rms_norm(x, residual, (2, 7), weight, 1e-5, weight_offset=weight_offset)

    assert torch.autograd.gradcheck(norm, inputs)
    assert torch.autograd.gradcheck(add_norm, (x, residual) + inputs[1:])


@pytest.mark.parametrize("path", ["function", "op", "add"])
def test_second_order_is_refused_with_a_clear_error(path):
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    weight = torch.rand(7, dtype=torch.float64, requires_grad=True)
    call = {
        "function": lambda x, w: rt.rms_norm(x, 7, w),
        "op": lambda x, w: torch.ops.rmsnorm.rms_norm(x, [7], w, None, 0.0),
        "add": lambda x, w: rt.add_rms_norm(x, x.detach(), 7, w)[0],
    }[path]
    with pytest.raises(RuntimeError, match="first derivatives only.*torch.nn.functional.rms_norm"):
        torch.autograd.gradgradcheck(call, (x, weight))


def opcheck_samples():
    def t(*shape, dtype=torch.float32, grad=False):
        return torch.randn(*shape, dtype=dtype).requires_grad_(grad)

    transposed = t(16, 4).t()
    yield "rms_norm", (t(3, 8), [8], t(8), None, 0.0)
    yield "rms_norm", (t(3, 8, grad=True), [8], t(8, grad=True), 1e-5, 0.0)
    yield "rms_norm", (t(2, 3, 8, grad=True), [3, 8], None, None, 0.0)
    yield "rms_norm", (transposed.requires_grad_(), [16], t(16, grad=True), 1e-6, 1.0)
    yield "rms_norm", (t(4, 8, dtype=torch.bfloat16, grad=True), [8], t(8, grad=True), None, 0.0)
    yield "rms_norm_backward", (t(3, 8), t(3, 8), [8], t(8), None, 0.0)
    yield (
        "rms_norm_backward",
        (t(3, 8, dtype=torch.float16), t(3, 8, dtype=torch.float16), [8], None, 1e-5, 0.0),
    )
    yield "add_rms_norm", (t(3, 8, grad=True), t(3, 8, grad=True), [8], t(8, grad=True), 1e-6, 0.0)
    yield (
        "add_rms_norm",
        (
            t(3, 8, dtype=torch.float64),
            t(3, 8, dtype=torch.float64),
            [8],
            t(8, dtype=torch.float64),
            None,
            1.0,
        ),
    )
    yield "add_rms_norm_backward", (t(3, 8), t(3, 8), t(3, 8), [8], t(8), None, 0.0)


@pytest.mark.parametrize(
    "name, args", list(opcheck_samples()), ids=lambda v: v if isinstance(v, str) else None
)
def test_opcheck(name, args):
    # Schema, fake implementation, autograd registration and AOT dispatch:
    # torch's own test utility for custom ops.
    torch.library.opcheck(getattr(torch.ops.rmsnorm, name).default, args)


# ---------------------------------------------------------------------------
# torch.compile of a pre-norm transformer block, with replace applied.
# ---------------------------------------------------------------------------


class PreNormBlock(torch.nn.Module):
    """A decoder block: RMSNorm, causal self-attention, RMSNorm, MLP, each with a residual."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.attention_norm = torch.nn.RMSNorm(dim, eps=1e-6)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.mlp_norm = torch.nn.RMSNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (dim // self.heads) ** 0.5
        causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        attention = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + self.out(attention.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


def run_block(call, block, x, grad_output):
    """call(x) (block itself or its compiled form): the output and all gradients."""
    x = x.detach().clone().requires_grad_()
    y = call(x)
    y.backward(grad_output)
    grads = {name: p.grad for name, p in block.named_parameters()}
    return y.detach(), x.grad, grads


# inductor, torch.compile's default. .ci/sanitize.sh preloads the ASan runtime
# into every process, inductor's C++ compiler included, whose own leaks then
# fail the build: there the block runs on aot_eager, which traces, partitions
# and differentiates the same graph without compiling C++.
COMPILE_BACKEND = "aot_eager" if os.environ.get("RMSNORM_SANITIZED") else "inductor"


# torch.compile's inductor backend calls torch.jit.script and script_method
# inside torch, which torch 2.13 deprecates: 14 warnings a run, none of them
# about this project's code.
@pytest.mark.filterwarnings("ignore:`torch.jit.script:DeprecationWarning")
def test_compiled_block_with_replace_matches_the_unreplaced_block():
    torch.manual_seed(0)
    reference = PreNormBlock()
    # Weights away from ones, so that grad_weight and the weight both matter.
    with torch.no_grad():
        for norm in (reference.attention_norm, reference.mlp_norm):
            norm.weight.uniform_(0.5, 1.5)
    block = copy.deepcopy(reference)
    assert rt.replace(block) == 2

    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    x, grad_output = torch.randn(2, 9, 64), torch.randn(2, 9, 64)
    # The graph holds the op: replace took effect, and nothing broke the graph.
    run_block(
        torch.compile(block, fullgraph=True, backend=recording_backend), block, x, grad_output
    )
    targets = [node.target for node in graphs[0].graph.nodes]
    assert targets.count(torch.ops.rmsnorm.rms_norm.default) == 2
    block.zero_grad()

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=COMPILE_BACKEND)
    y, grad_x, grads = run_block(compiled, block, x, grad_output)
    y_ref, grad_x_ref, grads_ref = run_block(reference, reference, x, grad_output)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(grad_x, grad_x_ref)
    assert grads.keys() == grads_ref.keys()
    for name in grads_ref:
        torch.testing.assert_close(
            grads[name], grads_ref[name], msg=lambda m, name=name: f"{name}: {m}"
        )


# ---------------------------------------------------------------------------
# The module and replace.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((64,), {}),
        ((64,), {"eps": 1e-5}),
        (([4, 64],), {"elementwise_affine": False}),
        ((64,), {"dtype": torch.float64}),
    ],
)
def test_module_is_torch_rmsnorm_in_all_but_speed(args, kwargs):
    torch.manual_seed(1)
    theirs = torch.nn.RMSNorm(*args, **kwargs)
    ours = rt.RMSNorm(*args, **kwargs)
    assert isinstance(ours, torch.nn.RMSNorm)
    assert repr(ours) == repr(theirs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    if theirs.weight is not None:
        with torch.no_grad():
            theirs.weight.uniform_(0.5, 1.5)
    ours.load_state_dict(theirs.state_dict())  # checkpoints load either way
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 4, 64, dtype=kwargs.get("dtype", torch.float32))
    assert_matches(ours(x), theirs(x), what="module output")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_module_weight_offset_is_gemmas_one_plus_weight(dtype):
    ours = rt.RMSNorm(64, eps=1e-6, dtype=dtype, weight_offset=1.0)
    assert torch.equal(ours.weight, torch.zeros(64, dtype=dtype))  # starts as plain normalisation
    assert repr(ours) == (
        "RMSNorm((64,), eps=1e-06, elementwise_affine=True, weight_offset=1.0)"
    )
    assert list(ours.state_dict()) == ["weight"]
    with torch.no_grad():
        ours.weight.uniform_(-0.5, 0.5)
    x = torch.randn(3, 4, 64, dtype=dtype)
    # torch's functional with the factor formed in float64, rounded once to the dtype
    x64, factor = x.double(), 1.0 + ours.weight.double()
    expected = (x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6) * factor).to(dtype)
    assert_matches(ours(x), expected, what="module output with weight_offset=1")
    y, h = ours(x, x)
    assert_matches(y, ours(x + x), what="fused step with weight_offset=1")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"weight_offset": 1.0, "elementwise_affine": False}, ValueError),
        ({"weight_offset": "1"}, TypeError),
        ({"weight_offset": True}, TypeError),
    ],
)
def test_module_weight_offset_is_checked(kwargs, error):
    with pytest.raises(error, match="weight_offset"):
        rt.RMSNorm(8, **kwargs)


def test_module_forward_with_a_residual_is_the_fused_step():
    layer = rt.RMSNorm(32, eps=1e-6)
    x, residual = torch.randn(4, 32), torch.randn(4, 32)
    y, h = layer(x, residual)
    assert torch.equal(h, x + residual)
    assert torch.equal(y, layer(x + residual))


def test_replace_swaps_every_rmsnorm_in_place_and_keeps_parameters():
    model = torch.nn.Sequential(
        torch.nn.RMSNorm(8),
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8, eps=1e-5)),
        torch.nn.LayerNorm(8),
    )
    norms = [model[0], model[1][1]]
    weights = [norm.weight for norm in norms]
    keys = model.state_dict().keys()
    assert rt.replace(model) == 2
    assert [model[0], model[1][1]] == norms  # the same module objects
    assert all(type(norm) is rt.RMSNorm for norm in norms)
    assert [norm.weight for norm in norms] == weights and all(
        a is b for a, b in zip((n.weight for n in norms), weights)
    )
    assert type(model[2]) is torch.nn.LayerNorm
    assert model.state_dict().keys() == keys
    with pytest.warns(UserWarning, match="turned none"):
        assert rt.replace(model) == 0  # nothing left to swap
    norm = torch.nn.RMSNorm(8)
    assert rt.replace(norm) == 1 and type(norm) is rt.RMSNorm


# torch 2.13 deprecates torch.jit.script itself and warns on every use; the
# refusal, not the deprecation, is what this test is about.
@pytest.mark.filterwarnings("ignore:`torch.jit.script:DeprecationWarning")
def test_jit_script_is_refused_with_the_reason():
    with pytest.raises(RuntimeError, match="does not support torch.jit.script"):
        torch.jit.script(rt.RMSNorm(8))


# ---------------------------------------------------------------------------
# What the kernels do not serve goes to torch; shape errors are torch's.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, weight",
    [
        (torch.randn(3, 8, dtype=torch.complex64), None),
        (torch.randn(3, 8, dtype=torch.float16), torch.rand(8, dtype=torch.bfloat16)),
        (torch.randn(3, 8), torch.rand(8, dtype=torch.float16)),
        (torch.randn(3, 8, device="meta"), torch.rand(8, device="meta")),
    ],
    ids=["complex64", "float16-weight_bfloat16", "float32-weight_float16", "meta_device"],
)
def test_unserved_tensors_go_to_torch(x, weight):
    ours = rt.rms_norm(x, [8], weight, 1e-6)
    theirs = F.rms_norm(x, [8], weight, 1e-6)
    assert ours.dtype == theirs.dtype and ours.device == theirs.device
    if x.device.type != "meta":
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    "shape, normalized_shape, weight_shape",
    [((3, 8), [7], None), ((8,), [2, 8], None), ((3, 8), [8], (7,)), ((3, 8), [8], (1, 8))],
)
@pytest.mark.parametrize("path", ["function", "op"])
def test_shape_errors_are_torchs(shape, normalized_shape, weight_shape, path):
    x = torch.randn(shape)
    weight = None if weight_shape is None else torch.rand(weight_shape)
    with pytest.raises((RuntimeError, ValueError)) as theirs:
        F.rms_norm(x, normalized_shape, weight)
    with pytest.raises(type(theirs.value)) as ours:
        if path == "function":
            rt.rms_norm(x, normalized_shape, weight)
        else:
            torch.ops.rmsnorm.rms_norm(x, normalized_shape, weight, None, 0.0)
    assert str(theirs.value) in str(ours.value)


def test_residual_of_another_shape_is_an_error():
    # The NumPy API's error (torch has no residual), on the kernels' path and the op's
    with pytest.raises(ValueError, match=r"residual must have the input's shape \(3, 8\)"):
        rt.add_rms_norm(torch.randn(3, 8), torch.randn(2, 8), 8)
    with pytest.raises(ValueError, match=r"residual must have the input's shape \(3, 8\)"):
        torch.ops.rmsnorm.add_rms_norm(torch.randn(3, 8), torch.randn(2, 8), [8], None, None, 0.0)


def test_export_holds_the_op():
    exported = torch.export.export(rt.RMSNorm(64), (torch.randn(3, 64),))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets == [torch.ops.rmsnorm.rms_norm.default]
    x = torch.randn(3, 64)  # export specialises the batch size
    torch.testing.assert_close(exported.module()(x), F.rms_norm(x, [64], torch.ones(64)))


@pytest.mark.parametrize("path", list(PATHS))
def test_large_outputs_match_torch(path):
    # 1024 rows of 2048 floats, 8 MiB: outputs this large ask for huge
    # pages, and must work as any tensor does.
    x, weight, grad_output = (
        torch.from_numpy(a) for a in make_inputs((1024, 2048), (2048,), np.float32, 1e-6)
    )
    check_against_torch(path, x, weight, grad_output, (2048,), 1e-6)
    y = rt.rms_norm(x, [2048], weight, 1e-6)
    assert y.is_contiguous() and y.nbytes >= rt._HUGE_PAGES_MIN_BYTES
    y.mul_(2)  # writable, in place


def test_a_large_output_grows_as_any_tensor_does():
    # Outputs of 4 MiB and more were NumPy's memory, whose storage torch
    # cannot resize: out= of a larger result raised.
    x, weight = torch.randn(1024, 2048), torch.ones(2048)
    y = rt.rms_norm(x, [2048], weight, 1e-6)
    assert y.nbytes >= rt._HUGE_PAGES_MIN_BYTES
    torch.cat([x, x], out=y.resize_(0))
    torch.testing.assert_close(y, torch.cat([x, x]), rtol=0, atol=0)


def test_torch_func_transforms_go_to_torch():
    # torch 2.13's custom-op autograd does not support torch.func's
    # transforms: inside them the functions call torch's own composite.
    x, weight = torch.randn(4, 8, dtype=torch.float64), torch.rand(8, dtype=torch.float64)
    for transform in (torch.func.grad, torch.func.jacrev):
        ours = transform(lambda x: rt.rms_norm(x, [8], weight).sum())(x)
        theirs = transform(lambda x: F.rms_norm(x, [8], weight).sum())(x)
        torch.testing.assert_close(ours, theirs)
    batched = torch.randn(3, 4, 8)
    ours = torch.vmap(lambda x: rt.add_rms_norm(x, x, [8])[0])(batched)
    torch.testing.assert_close(ours, F.rms_norm(2 * batched, [8]))
