"""The streamed map's memory plan (engine/experiments/ablation/wavefront.py): what it holds, known before any
weight is read, and one line when its budget cannot hold it. Made by engine/models/memory.py plan_stream,
which re-exports `StreamPlan` and `budget_bytes`."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.errors import UserError


@dataclass(frozen=True)
class StreamPlan:
    """What a streamed map (engine/experiments/ablation/wavefront.py) holds, known before any weight is
    read: a window of decoder layers and one read ahead, the weights outside the layers, every
    branch's hidden states (where the layers compute), one batch's forward; and what it reads."""

    device: str
    layers: int
    window: int  # decoder layers held while one computes (the neighbour mean: 3)
    layer_bytes: int  # the largest decoder layer in the run's dtype
    outer_bytes: int  # embedding, head, final norm: held the whole run
    branches: int  # the clean pass and one per ablated unit
    texts: int
    state_bytes: tuple[int, ...]  # every branch's states of each evaluation batch
    batch_texts: int  # texts in the largest batch
    forward_peak: int  # one batch's layer forward, or its head and loss
    read_bytes: int  # the checkpoint's bytes: each weight read once
    device_budget: int  # --max-memory's (or MARGIN of the free memory)
    host_budget: int
    budget_source: str = "--max-memory"

    @property
    def held(self) -> int:
        """The layers at once: the window and the one read ahead."""
        return self.window + 1

    @property
    def states(self) -> int:
        return sum(self.state_bytes)

    def _peak(self, states: int) -> int:
        return self.held * self.layer_bytes + self.outer_bytes + states + self.forward_peak

    @property
    def device_peak(self) -> int:
        return self._peak(self.states)

    @property
    def minimum(self) -> int:
        """The window and the branch states of one batch of texts: less than this maps nothing."""
        return self._peak(max(self.state_bytes, default=0))

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def host_peak(self) -> int:
        """On a GPU the read-ahead layer as read and as its pinned copy; on the CPU the device's peak."""
        return 2 * self.layer_bytes if self.on_gpu else self.device_peak

    def line(self) -> str:
        host = f", {_gib(self.host_peak)} in host memory" if self.on_gpu else ""
        window = f"a window of {self.window} layer{'s' if self.window > 1 else ''} and one read ahead"
        return (f"streamed plan on {self.device}: {self.layers} layers read once ({_gib(self.read_bytes)}), "
                f"{window} ({_gib(self.layer_bytes)} each), {self.branches} branches of "
                f"{self.texts} texts ({_gib(self.states)} of states); peak {_gib(self.device_peak)} on "
                f"{self.device}{host}; {self.budget_source} allows {_gib(self.device_budget)}")

    def check(self) -> None:
        """One line when the budget cannot hold the plan: what would fit (fewer texts, a larger budget)."""
        if self.on_gpu and self.host_peak > self.host_budget:
            raise UserError(f"the streamed map reads each layer through {_gib(self.host_peak)} of host memory "
                            f"({_gib(self.layer_bytes)} a layer) but {self.budget_source} allows "
                            f"{_gib(self.host_budget)} on cpu: raise it")
        if self.device_peak <= self.device_budget:
            return
        allows = f"{self.budget_source} allows {_gib(self.device_budget)}"
        if self.minimum > self.device_budget:
            raise UserError(f"the streamed map needs at least {_gib(self.minimum)} on {self.device} for {self.held} "
                            f"layers and the branch states of {self.batch_texts} texts; {allows}: raise it or map "
                            "fewer texts")
        fit, room = 0, self.device_budget - self._peak(0)
        for states in self.state_bytes:
            if states > room:
                break
            fit, room = fit + 1, room - states
        raise UserError(f"the streamed map needs {_gib(self.device_peak)} on {self.device} for {self.held} layers "
                        f"and the branch states of {self.texts} texts ({self.branches} branches); {allows}: raise "
                        f"it, map fewer texts (about {fit * self.texts // len(self.state_bytes)} fit) or ablate "
                        "fewer --layers")


def _gib(size: float) -> str:
    """Binary units, as --max-memory is mostly written."""
    return f"{size / 2**30:.2f} GiB" if size >= 2**27 else f"{size / 2**20:.1f} MiB"


def budget_bytes(size: str) -> int:
    """A --max-memory size ('2GiB', '500MB') in bytes, as accelerate reads it."""
    from accelerate.utils import convert_file_size_to_int

    return int(convert_file_size_to_int(size))
