"""Memory: a plan of what a run will hold, made before the model loads, and out-of-memory errors
turned into one line that says what to change.

The plan counts the tensors our own code keeps alive, not the allocator's slack: the weights
(parameters x bytes, counted from the config on the meta device, nothing allocated), the prefix
cache (one hidden state per layer for every padded evaluation token, exactly what
`Evaluator.build_cache` keeps), the peak of one evaluation forward (activations and the logits,
with the float32 log-softmax done in chunks), and, where the experiment trains, the training state.
`check_fits` compares it with free memory with a safety margin, so a run that cannot fit stops
before any time is spent loading.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from engine.core.errors import UserError

# the shape and the free memory the plan reads, importable from here as before the split (and patched
# here by tests: the plan calls them through this module)
from engine.models.device_memory import cuda_devices as cuda_devices
from engine.models.device_memory import free_memory as free_memory
from engine.models.device_memory import model_bytes as model_bytes
from engine.models.shape import ModelPreview as ModelPreview
from engine.models.shape import ModelShape as ModelShape
from engine.models.shape import preview_model as preview_model
from engine.models.stream_plan import StreamPlan as StreamPlan
from engine.models.stream_plan import budget_bytes as budget_bytes

if TYPE_CHECKING:
    from engine.models.placement import Hardware, Placement

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MARGIN = 0.9  # plan at most 90 % of free memory: the allocator and CUDA context need the rest
SOFTMAX_CHUNK_BYTES = 64 * 2**20  # float32 logits handled at once by perplexity.token_nll
# The auto evaluation batch on the CPU, where a wider batch only pads more (the 48 texts on the embedded
# model, one thread, take 4.2 s in batches of 8 or 16 and 5.3 s in one batch of 48: 992 vs 1344 padded
# tokens), and for a model placed by --device-map (no one device's free memory says what fits).
FIXED_EVAL_BATCH = 8
GB = 1e9


@dataclass(frozen=True)
class Training:
    """What an experiment trains: the parameters, and one step's batch."""

    params: int
    batch_size: int
    block_size: int
    layers_with_graph: int  # layers whose activations are kept for the backward


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of each part a run holds at its peak on one device."""

    device: str
    dtype: str
    weights: int
    prefix_cache: int
    activations: int
    logits: int
    training: int = 0
    eval_batch_size: int = 0  # evaluation texts per forward the plan assumes
    dtype_reason: str = ""  # why this dtype (engine.models.placement `Placement.why`)
    layer_devices: tuple[str, ...] = ()  # with --device-map: where each layer will live ('disk': offloaded)
    checkpoints: int = 0  # bytes the run's checkpoints hold at most, on the session's disk (checked before the load)
    host_cache: int = 0  # the prefix cache's bytes when it is kept in host memory (`place_prefix_cache`)
    stream: StreamPlan | None = None  # the run streams its layers (`--stream`, or a model over its budget)
    placement: Placement | None = None  # the device, dtype and why decided here, handed to the load as they are

    @property
    def total(self) -> int:
        """Bytes at the peak on the device: a streamed run's window, states and forward, else the whole model's."""
        if self.stream is not None:
            return self.stream.device_peak
        return self.weights + self.prefix_cache + self.activations + self.logits + self.training

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights, "prefix cache": self.prefix_cache, "activations": self.activations,
                "logits": self.logits, "training": self.training}

    def line(self) -> str:
        """The plan in one printable line."""
        if self.stream is not None:
            return self.stream.line()
        shown = " + ".join(f"{name} {_gb(size)}" for name, size in self.parts().items() if size)
        batches = f"; evaluation batches of {self.eval_batch_size} texts" if self.eval_batch_size else ""
        why = f"; dtype {self.dtype} ({self.dtype_reason})" if self.dtype_reason else ""
        where = f"on {self.device}"
        if self.layer_devices:  # placed by --device-map: where the layers go, disk named as disk
            from engine.models.placement import placement_text

            where = f"over {placement_text(list(self.layer_devices))}"
        host = f"; prefix cache {_gb(self.host_cache)} in host memory" if self.host_cache else ""
        return f"memory plan {where} ({self.dtype}): {shown} = {_gb(self.total)}{batches}{host}{why}"

    def offloaded_layers(self) -> list[int]:
        """The layers accelerate will keep off the computing device: on disk, or on the CPU while
        the others compute on a GPU (their weights come back at every forward, so an edit is lost)."""
        on_gpu = any(device.startswith("cuda") for device in self.layer_devices)
        return [index for index, device in enumerate(self.layer_devices)
                if device == "disk" or (on_gpu and device == "cpu")]

    def to_dict(self) -> dict[str, Any]:
        placed = {"layer_devices": list(self.layer_devices)} if self.layer_devices else {}
        return {"device": self.device, "dtype": self.dtype, **{k.replace(" ", "_"): v for k, v in self.parts().items()},
                "total": self.total, "eval_batch_size": self.eval_batch_size, "dtype_reason": self.dtype_reason,
                **placed, **({"host_cache": self.host_cache} if self.host_cache else {}),
                **({"stream": asdict(self.stream)} if self.stream is not None else {})}


def stream_budgets(device: str, max_memory: str | None) -> tuple[int, int, str]:
    """(device budget, host budget, what set them): --max-memory's entries for the device (its GPU
    index, or cpu) and for cpu; an entry not given is MARGIN of that memory free now."""
    from engine.models.placement import device_index, parse_max_memory

    limits = parse_max_memory(max_memory) or {}
    key: int | str = device_index(device) if device.startswith("cuda") else "cpu"
    other = next((name for name in limits if name not in (key, "cpu")), None)
    if other is not None:
        raise UserError(f"--max-memory names device {other}, but this streamed map runs on {device}: give "
                        f"{key}=SIZE" + ("" if key == "cpu" else " and cpu=SIZE"))
    host = budget_bytes(limits["cpu"]) if "cpu" in limits else int(MARGIN * free_memory("cpu"))
    on_device = budget_bytes(limits[key]) if key in limits else int(MARGIN * free_memory(device))
    return on_device, host, "--max-memory" if key in limits else "the free memory"


def plan_stream(shape: ModelShape, dtype: str, device: str, widths: Sequence[tuple[int, int]], branches: int,
                window: int, layer_bytes: int, outer_bytes: int, read_bytes: int,
                max_memory: str | None) -> StreamPlan:
    """The streamed map's plan: `widths` the (texts, padded width) of each evaluation batch, `branches`
    the clean pass and the units, `window` the layers a unit's removal reads."""
    size = BYTES[dtype]
    activations, logits = forward_bytes(shape, size, widths)
    device_budget, host_budget, source = stream_budgets(device, max_memory)
    return StreamPlan(device, shape.n_layers, window, layer_bytes, outer_bytes, branches,
                      sum(rows for rows, _ in widths), tuple(branches * rows * width * shape.hidden * size
                                                             for rows, width in widths),
                      max((rows for rows, _ in widths), default=0), max(activations, logits), read_bytes,
                      device_budget, host_budget, source)


def _gb(size: float) -> str:
    return f"{size / GB:.2f} GB"


def batch_widths(lengths: Sequence[int], batch_size: int) -> list[tuple[int, int]]:
    """(rows, padded width) of each evaluation batch, grouped as `tokenize_batches` groups them."""
    ordered = sorted(lengths)
    return [(len(ordered[s : s + batch_size]), max(ordered[s : s + batch_size]))
            for s in range(0, len(ordered), batch_size)]


def softmax_chunk_tokens(vocab: int) -> int:
    """Tokens whose float32 logits fit in SOFTMAX_CHUNK_BYTES (at least one)."""
    return max(1, SOFTMAX_CHUNK_BYTES // (4 * max(vocab, 1)))


def plan_memory(
    shape: ModelShape,
    dtype: str,
    device: str,
    lengths: Sequence[int],
    batch_size: int,
    prefix_cache: bool = True,
    training: Training | None = None,
) -> MemoryPlan:
    """The plan for evaluating texts of these token lengths (after truncation) in batches of
    `batch_size`, with the prefix cache when the experiment builds one, plus training state."""
    size = BYTES[dtype]
    widths = batch_widths(lengths, batch_size) or [(0, 0)]
    cache = shape.n_layers * shape.hidden * size * sum(rows * width for rows, width in widths) if prefix_cache else 0
    activations, logits = forward_bytes(shape, size, widths)
    train = training_bytes(shape, dtype, training) if training is not None else 0
    return MemoryPlan(device, dtype, shape.params * size, cache, activations, logits, train, batch_size)


def forward_bytes(shape: ModelShape, size: int, widths: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(activations, logits) of the largest batch's forward: one layer's live tensors and the head's."""
    rows, width = max(widths or [(0, 0)], key=lambda w: w[0] * w[1])
    tokens = rows * max((width for _, width in widths), default=0)
    # one layer's live tensors (residual, norm, q/k/v/o, the FFN's gate/up/act) plus eager attention scores
    activations = tokens * (6 * shape.hidden + 3 * shape.intermediate) * size
    activations += rows * shape.heads * width * width * (size + 4)
    chunk = min(tokens, softmax_chunk_tokens(shape.vocab))
    return activations, tokens * shape.vocab * size + 2 * chunk * shape.vocab * 4


def training_bytes(shape: ModelShape, dtype: str, training: Training) -> int:
    """The training state plus one step's activations kept for the backward, and its logits."""
    size = BYTES[dtype]
    step_tokens = training.batch_size * training.block_size
    per_layer = step_tokens * (10 * shape.hidden + 4 * shape.intermediate) * size
    per_layer += training.batch_size * shape.heads * training.block_size**2 * (2 * size + 4)
    return (training_state_bytes(training.params, dtype) + training.layers_with_graph * per_layer
            + step_tokens * shape.vocab * (size + 3 * 4))  # logits, their float32 copy, log-softmax, grad


def auto_eval_batch(
    device: str,
    shape: ModelShape,
    dtype: str,
    lengths: Sequence[int],
    free_bytes: int,
    prefix_cache: bool = True,
    training: Training | None = None,
) -> int:
    """The evaluation batch when none is asked for. On a GPU: the largest, up to every text in one
    forward, whose whole plan (weights, prefix cache, activations, logits, training) passes
    `check_fits` against `free_bytes`, the memory free before the weights loaded; when none does,
    the largest that passes with the prefix cache on the host (`place_prefix_cache`); 1 when none
    does either (check_fits then says what to change). On the CPU: FIXED_EVAL_BATCH."""
    if not device.startswith("cuda"):
        return FIXED_EVAL_BATCH
    def fits(size: int, host_cache: bool) -> bool:
        plan = plan_memory(shape, dtype, device, lengths, size, prefix_cache, training)
        return (place_prefix_cache(plan, free_bytes) if host_cache else plan).total <= MARGIN * free_bytes

    sizes = range(1, len(lengths) + 1)  # the cache beside the model if any batch allows, else on the host
    return max([size for size in sizes if fits(size, False)] or [size for size in sizes if fits(size, True)],
               default=1)


def place_prefix_cache(plan: MemoryPlan, free_bytes: int, host_free: int | None = None) -> MemoryPlan:
    """The plan with its prefix cache in host memory, when the whole plan does not fit in the GPU's
    `free_bytes` but the rest does and the host has room (`host_free`, default: what it has now).
    A dataset's long windows make a large cache: n_layers x hidden x tokens, 75 GB for an 8B model
    (32 layers, 4096 wide, float16) on WikiText-2's 287k tokens. The evaluator then keeps each
    layer's input on the host and copies one batch's input of one layer back per evaluation."""
    if (not plan.device.startswith("cuda") or not plan.prefix_cache or plan.total <= MARGIN * free_bytes
            or plan.total - plan.prefix_cache > MARGIN * free_bytes):
        return plan
    if plan.prefix_cache > MARGIN * (free_memory("cpu") if host_free is None else host_free):
        return plan
    return replace(plan, prefix_cache=0, host_cache=plan.prefix_cache)


def loaded_cache_on_host(model: Any, tokenizer: Any, texts: Any, settings: Any, batch_size: int) -> bool:
    """Whether a loaded model's evaluator keeps its prefix cache on the host (`place_prefix_cache`,
    with the memory its weights hold counted as free, as `plan_run` saw it before the load). Never
    on the CPU, without a prefix cache, or for a model placed by --device-map."""
    devices = cuda_devices(model)
    if not devices or getattr(model, "hf_device_map", None) or not getattr(settings, "prefix_cache", True):
        return False
    shape = ModelShape.from_config(model.config)
    plan = plan_memory(shape, str(model.dtype).removeprefix("torch."), devices[0],
                       text_lengths(tokenizer, texts, settings.max_length), batch_size, True,
                       settings.training_needs(shape))
    return place_prefix_cache(plan, free_memory(devices[0]) + model_bytes(model)).host_cache > 0


def loaded_eval_batch(model: Any, tokenizer: Any, texts: Any, settings: Any) -> int:
    """`settings.eval_batch_size`, or when it is auto (None), `auto_eval_batch` for a loaded model:
    the memory its weights hold counts as free, as `plan_run` saw it before the load. A model placed
    by --device-map keeps the fixed batch: its activations and logits do not split evenly over the
    devices, so no one device's free memory says what fits."""
    if settings.eval_batch_size:
        return int(settings.eval_batch_size)
    devices = cuda_devices(model)
    if not devices or getattr(model, "hf_device_map", None):
        return FIXED_EVAL_BATCH
    shape = ModelShape.from_config(model.config)
    free = free_memory(devices[0]) + model_bytes(model)
    return auto_eval_batch(devices[0], shape, str(model.dtype).removeprefix("torch."),
                           text_lengths(tokenizer, texts, settings.max_length), free,
                           getattr(settings, "prefix_cache", True), settings.training_needs(shape))


def training_state_bytes(params: int, dtype: str) -> int:
    """AdamW's state for `params` trained parameters: two float32 moments, the gradients, and for
    a half-precision model the float32 master copy and its float32 gradients."""
    size = BYTES[dtype]
    state = 8 * params + size * params
    if size < 4:
        state += 8 * params
    return state


def text_lengths(tokenizer: Any, texts: Any, max_length: int) -> list[int]:
    """Token counts of the evaluation rows as the evaluator will see them: the texts truncated, or
    a dataset's windows (an engine.data.eval_data.EvalSource with windows: --context tokens each)."""
    windows = getattr(texts, "windows", None)
    if windows is not None:
        return [len(row) for row in windows.rows]
    texts = getattr(texts, "texts", texts)
    return [len(tokenizer(t, truncation=True, max_length=max_length)["input_ids"]) for t in texts]


def plan_run(name: str, settings: Any, device: str = "auto", dtype: str = "auto",
             trust_remote_code: bool = False, device_map: str | None = None, max_memory: str | None = None,
             preview: ModelPreview | None = None, hardware: Hardware | None = None) -> MemoryPlan:
    """The plan of an experiment on a model, made before its weights load: the config and the
    tokenizer are read (cheap; `preview` when they were already), the evaluation texts the settings
    name are tokenized. Settings that train add their training state (`training_of`). An auto
    evaluation batch is chosen here as the evaluator will choose it (`auto_eval_batch`). With
    `device_map`, where each layer will go under `max_memory`, as the load will place it. The
    device and dtype are `resolve_placement`'s on `hardware` (this machine's when None); on a
    cluster's (not local) the plan is sized on the CPU of this machine, in the dtype its GPU gets."""
    from engine.data.text import eval_texts
    from engine.models.placement import Flags, planned_layer_devices, resolve_placement

    preview = preview or preview_model(name, trust_remote_code)
    config, tokenizer, shape = preview.config, preview.tokenizer, preview.shape
    streamable = hasattr(settings, "stream") and device_map is None  # --max-memory is then the streamed budget
    placement = resolve_placement(Flags(device, dtype, device_map, None if streamable else max_memory), hardware,
                                  shape.params, config.model_type)
    local = hardware is None or hardware.local
    chosen_device, chosen_dtype = placement.device if local else "cpu", placement.dtype
    max_length = getattr(settings, "max_length", 256)
    if hasattr(settings, "eval_source"):  # the evaluation-text group: its texts or dataset windows
        texts = settings.eval_source(tokenizer)
    else:
        eval_file = getattr(settings, "eval_file", None)
        texts = eval_texts(Path(eval_file) if eval_file else None, getattr(settings, "eval_set", "full"))
    lengths = text_lengths(tokenizer, texts, max_length)
    training = settings.training_needs(shape)
    prefix_cache = getattr(settings, "prefix_cache", True)
    batch_size = getattr(settings, "eval_batch_size", getattr(settings, "batch_size", FIXED_EVAL_BATCH))
    if not batch_size and device_map is not None:  # as `loaded_eval_batch` will choose
        batch_size = FIXED_EVAL_BATCH
    elif not batch_size:  # auto: what the evaluator will choose, from the memory free now
        batch_size = auto_eval_batch(chosen_device, shape, chosen_dtype, lengths, free_memory(chosen_device),
                                     prefix_cache, training)
    plan = plan_memory(shape, chosen_dtype, chosen_device, lengths, batch_size, prefix_cache, training)
    if device_map is None and chosen_device.startswith("cuda"):
        plan = place_prefix_cache(plan, free_memory(chosen_device))
    placed = planned_layer_devices(preview.meta, placement) if device_map else ()
    plan = replace(plan, device=placement.device, dtype_reason=placement.why, layer_devices=tuple(placed),
                   placement=placement, checkpoints=settings.checkpoint_params(shape) * BYTES[chosen_dtype])
    if streamable and local:
        streamed = streamed_plan(shape, chosen_dtype, chosen_device, batch_widths(lengths, batch_size), settings,
                                 max_memory, config)
        if settings.stream:  # asked for: its budget must hold it
            streamed.check()
        if settings.stream or plan.total > streamed.device_budget >= streamed.device_peak:  # or only it fits
            plan = replace(plan, stream=streamed)
    return plan


def streamed_plan(shape: ModelShape, dtype: str, device: str, widths: Sequence[tuple[int, int]], settings: Any,
                  max_memory: str | None, config: Any = None) -> StreamPlan:
    """The streamed map's plan from the model's shape (layer 0's size for every layer), before any
    read; the bytes read are the checkpoint's in its stored dtype (the config's, else the run's)."""
    size = BYTES[dtype]
    stored = str(getattr(config, "dtype", None) or dtype)
    outer = shape.params - shape.n_layers * shape.layer_params
    return plan_stream(shape, dtype, device, widths, settings.branches(shape.n_layers), settings.window(),
                       shape.layer_params * size, outer * size,
                       shape.params * BYTES.get(stored.removeprefix("torch."), size), max_memory)


_ADVICE = {
    "weights": "--dtype float16 (bfloat16 on Ampere and later) or --device cpu",
    "prefix cache": "a smaller --eval-batch-size or --max-length, fewer evaluation texts, or --max-windows",
    "activations": "a smaller --eval-batch-size or --max-length",
    "logits": "a smaller --eval-batch-size or --max-length",
    "training": "a smaller --batch-size or --block-size",
}


def check_fits(plan: MemoryPlan, free_bytes: int, experiment: str = "this run") -> None:
    """One-line UserError naming the largest part and the flag that shrinks it, when the plan
    needs more than MARGIN of the free memory."""
    if plan.total <= MARGIN * free_bytes:
        return
    largest = max(plan.parts().items(), key=lambda item: item[1])[0]
    raise UserError(
        f"{experiment} needs about {_gb(plan.total)} on {plan.device} but {_gb(free_bytes)} is free "
        f"({largest} {_gb(plan.parts()[largest])}); try {_ADVICE[largest]}"
    )


Beside = Literal["beside", "release", "never"]


def fits_beside(plan: MemoryPlan, loaded_bytes: int, free_bytes: int) -> Beside:
    """Where a job goes on a device that already holds the console's model (`loaded_bytes`):
    'beside' it, only if the console 'release's its model first, or 'never'."""
    if plan.total <= MARGIN * free_bytes:
        return "beside"
    if plan.total <= MARGIN * (free_bytes + loaded_bytes):
        return "release"
    return "never"


def other_gpu(plan: MemoryPlan, busy: str, gpus: int, free_of: Callable[[str], int]) -> str | None:
    """The first of the `gpus` GPUs, other than `busy` (the one the console's model is on), whose
    free memory (`free_of(device)`) holds the plan; None when none does."""
    taken = int(busy.split(":")[1]) if ":" in busy else 0  # bare 'cuda' is the current GPU, 0 in the console
    for index in range(gpus):
        if index != taken and plan.total <= MARGIN * free_of(f"cuda:{index}"):
            return f"cuda:{index}"
    return None
