"""Hidden-state dynamics' words: DynamicsSettings (profiles, lenses, clusters), the `dynamics.layer`
event, and results/dynamics.json (angles by layer, PCA, clusters, logit lens). Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.core.errors import UserError
from engine.core.events import (
    Event,
    ResultDocument,
    event,
    renamed_v1,
    result,
)
from engine.core.settings import MAX_SEED, MAX_WINDOW, WINDOW_WHY, Settings, setting
from engine.experiments.contract import Contract, FigureShape, Frame

PROFILES = ("both", "state", "update")


LENSES = ("plain", "last-block")


CLUSTER_K = (2, 6)  # silhouette picks k in this range unless --clusters fixes it


@dataclass(frozen=True)
class DynamicsSettings(Settings):
    """Defaults: the embedded held-out corpus, first position of each text excluded (attention sink)."""

    text_file: str | None = setting(None, "UTF-8 file, one text per line (default: the built-in held-out "
                                    "corpus)", file="text file")
    max_tokens: int = setting(8192, "tokens to read at most", low=1)
    eval_batch_size: int = setting(8, "texts per forward pass", low=1, aliases=("--batch-size",))
    max_length: int = setting(256, "tokens per text at most", low=2, high=MAX_WINDOW, why=WINDOW_WHY)
    include_first: bool = setting(False, "keep each text's first position (the attention sink); excluded by "
                                  "default")
    profile: str = setting("both", "what PCA sees per token: both angle profiles, or one", choices=PROFILES)
    clusters: int = setting(0, "number of clusters; 0 picks k=2..6 by silhouette", low=0, high=20)
    components: int = setting(10, "PCA components kept", low=1)
    examples: int = setting(3, "example tokens per cluster", low=0)
    logit_lens: bool = setting(False, "also the next-token loss of every layer through the final norm and head")
    seed: int = setting(0, "PCA/KMeans seed", low=0, high=MAX_SEED)
    lens: str = setting("plain", "how the lens reads layer l: plain (its output through the final norm and "
                        "head) or last-block (its input through the last block, the final norm and head, as "
                        "paper B's scripts); last-block turns the lens on", choices=LENSES)

    stream: bool = setting(False, "read the model from its safetensors layer by layer, each weight once, every "
                           "batch's states advancing through the layer in memory (a model larger than memory; the "
                           "same result)", resume_free=True)

    @property
    def lens_on(self) -> bool:
        return self.logit_lens or self.lens != "plain"

    def check(self) -> None:
        if self.stream and self.lens == "last-block":
            raise UserError("--lens last-block runs the last layer on every layer's input, which a streamed pass "
                            "(each layer read once, in order) no longer holds; use --lens plain or drop --stream")

    def branches(self, n_layers: int) -> int:
        """A streamed pass's states, in units of one set of hidden states of every text: the running
        one and the L + 1 each token's trajectory keeps until the last layer (`BatchMeter.states`)."""
        return n_layers + 2

    def window(self) -> int:
        """Layers a streamed pass holds while one computes."""
        return 1

    def eval_source(self, tokenizer: Any) -> list[str]:
        """The texts the run reads (the memory plan's too): the file's or the held-out corpus's, up to
        --max-tokens."""
        from engine.experiments.dynamics.texts import dynamics_texts, select_texts

        return select_texts(tokenizer, dynamics_texts(self)[0], self.max_tokens, self.max_length)


@event("dynamics.layer", v1_fields={"index": "layer"})
class DynamicsLayer(Event):
    """Per-layer medians over the tokens seen so far, sent once all batches are in."""

    layer: int
    n_layers: int
    angle_state: float | None
    angle_update: float | None
    norm: float | None


@dataclass(frozen=True)
class Quartiles:
    """Median and quartiles over tokens; null where no token had a value."""

    median: float | None
    q1: float | None
    q3: float | None


@dataclass(frozen=True)
class DynamicsRow:
    """One layer of results/dynamics.json: angles (degrees) and norms over tokens."""

    layer: int
    angle_state: Quartiles  # theta(h_l, h_l+1)
    angle_update: Quartiles  # theta(dh_l, dh_l+1); null on the last layer
    norm: Quartiles  # |h_l+1|
    update_norm: Quartiles  # |dh_l|
    relative_update: Quartiles  # |dh_l| / |h_l|
    angle_final: Quartiles | None = None  # theta(h_l+1, h_L); absent in 0.1 sessions
    progress: Quartiles | None = None  # <h_l+1 - h_0, h_L - h_0> / |h_L - h_0|^2; absent in 0.1 sessions
    lens_loss: float | None = None  # with --logit-lens or --lens


@dataclass(frozen=True)
class PcaSample:
    """results/dynamics.json `pca.sample`: a fixed random sample of the tokens (at most a few
    hundred) in the first two PCA components, with their clusters, for a scatter of the clusters
    (absent before anatomy-tui 0.3). `token` indexes the analysed tokens in reading order."""

    token: list[int]
    pc1: list[float]
    pc2: list[float]
    label: list[int]


@dataclass(frozen=True)
class DynamicsCore:
    """results/dynamics.json `core`: medians over the middle half of the layers (`layers`, first and
    last), the numbers behind 'updates near 90 degrees'."""

    layers: list[int]
    angle_update_median: float | None
    angle_state_median: float | None
    relative_update_median: float | None


@dataclass(frozen=True)
class TokenCluster:
    """One cluster of results/dynamics.json `pca.clusters`, largest (label 0, the bulk) first."""

    label: int
    bulk: bool
    size: int  # tokens
    fraction: float
    median_position: float
    top_tokens: list[list[Any]]  # [token, count], most frequent first
    angle_state_median: list[float | None]  # per layer, over the cluster's tokens
    angle_update_median: list[float | None]
    examples: list[str]  # the most typical tokens in context, the token in [[ ]]


@dataclass(frozen=True)
class DynamicsPca:
    """results/dynamics.json `pca`: PCA of the per-token angle profiles, KMeans in PCA space."""

    profile: str
    explained: list[float]
    k: int
    k_choice: str
    silhouette: dict[str, float]  # k -> silhouette score (empty when --clusters fixed k)
    bulk_fraction: float
    clusters: list[TokenCluster]
    sample: PcaSample | None = None  # absent before anatomy-tui 0.3


@dataclass(frozen=True)
class LensLosses:
    """results/dynamics.json `logit_lens`: the next-token loss read at every layer."""

    lens: str | None = field(default=None, kw_only=True)  # plain or last-block; absent in 0.1 sessions
    loss: list[float | None]  # per layer
    final_loss: float | None
    predicted_tokens: int


@result("dynamics")
class DynamicsResult(ResultDocument):
    """results/dynamics.json."""

    model: str
    tokens: int
    texts: int
    text_source: str
    first_token: str  # included or excluded
    n_layers: int
    seconds: float
    settings: DynamicsSettings  # as the run resolved them
    embedding_norm: Quartiles
    core: DynamicsCore
    layers: list[DynamicsRow]
    pca: DynamicsPca
    logit_lens: LensLosses | None  # None without --logit-lens

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per layer: each measure's median (its name) and quartiles (`<name>_q1`, `_q3`), and
        the lens loss (None without --logit-lens)."""
        rows = []
        for row in self.layers:
            cells: dict[str, Any] = {"layer": row.layer}
            for name in ("angle_state", "angle_update", "angle_final", "progress", "norm", "update_norm",
                         "relative_update"):
                spread = getattr(row, name)
                cells |= {name: spread and spread.median, f"{name}_q1": spread and spread.q1,
                          f"{name}_q3": spread and spread.q3}
            rows.append(cells | {"lens_loss": row.lens_loss})
        return rows

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("layers"), list):
            doc["layers"] = [renamed_v1(row) for row in doc["layers"]]
        return doc


def sample() -> DynamicsResult:
    """Six layers' angles, a bulk and a start-of-text cluster, and 40 sampled tokens (the bulk on a
    ring round the origin, cluster 1 in a clump at (6, 3)): the tests' and snapshots' example."""
    def q(median: float) -> Quartiles:
        return Quartiles(median=median, q1=median - 5.0, q3=median + 5.0)

    layers = [
        DynamicsRow(layer=i, angle_state=q(20.0 + 2 * i), angle_update=q(95.0 - i), norm=q(10.0 + i),
                    update_norm=q(1.0), relative_update=q(0.1), angle_final=q(60.0 - 8 * i), progress=q(i / 6))
        for i in range(6)
    ]  # fmt: skip
    clusters = [
        TokenCluster(label=0, bulk=True, size=900, fraction=0.9, median_position=40.0,
                     top_tokens=[[" the", 40], [",", 30]], angle_state_median=[], angle_update_median=[],
                     examples=["of [the] city"]),
        TokenCluster(label=1, bulk=False, size=100, fraction=0.1, median_position=0.0, top_tokens=[["<s>", 50]],
                     angle_state_median=[], angle_update_median=[], examples=["[<s>] Once"]),
    ]  # fmt: skip
    points = [(math.cos(i / 5), math.sin(i / 5)) for i in range(30)]
    points += [(6.0 + 0.1 * (i % 3), 3.0 + 0.1 * (i // 3)) for i in range(10)]
    tokens = PcaSample(token=list(range(0, 80, 2)), pc1=[x for x, _ in points], pc2=[y for _, y in points],
                       label=[0] * 30 + [1] * 10)
    pca = DynamicsPca(profile="angle_update", explained=[0.6, 0.2], k=2, k_choice="fixed by --clusters",
                      silhouette={}, bulk_fraction=0.9, clusters=clusters, sample=tokens)
    core = DynamicsCore(layers=[1, 4], angle_update_median=93.0, angle_state_median=25.0, relative_update_median=0.1)
    return DynamicsResult(
        model="tiny", tokens=1000, texts=4, text_source="built-in", first_token="excluded", n_layers=6, seconds=1.0,
        settings=DynamicsSettings(), embedding_norm=q(8.0), core=core, layers=layers, pca=pca, logit_lens=None,
    )  # fmt: skip


CONTRACT = Contract(
    DynamicsSettings, DynamicsResult, sample,
    frame=Frame(columns=("layer", "angle_state", "angle_state_q1", "angle_state_q3", "angle_update"), rows=6),
    figure=FigureShape(panels=(("layer", "angle (degrees)"), ("PC1 (60%)", "PC2 (20%)"))),
)
