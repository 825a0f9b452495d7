"""What the user marked on the layer map for the prompt pane's modified model: whole layers (`x`,
replaced by their neighbours' mean; the noised model noises them) and attention or MLP blocks (`t`,
`m`: removed, their output zero so the residual passes by). A layer is marked whole or by its
blocks, never both: marking one replaces the other. Kept in the session's console.json, so read
back as untrusted (`from_json`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.models.families import PARTS, Block

SHORT = {"attention": "attn", "mlp": "mlp"}  # a block's name on screen: L11.mlp, L5.attn
MAX_MARKS = 4096  # more marks than this is no file the console wrote


@dataclass(frozen=True)
class Marks:
    layers: frozenset[int] = frozenset()
    blocks: frozenset[Block] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.layers or self.blocks)

    @property
    def sorted_layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.layers))

    @property
    def sorted_blocks(self) -> tuple[Block, ...]:
        return tuple(sorted(self.blocks, key=lambda block: (block[0], PARTS.index(block[1]))))

    def toggle_layer(self, layer: int) -> Marks:
        """`layer` marked whole (its block marks give way), or unmarked."""
        if layer in self.layers:
            return Marks(self.layers - {layer}, self.blocks)
        return Marks(self.layers | {layer}, frozenset(block for block in self.blocks if block[0] != layer))

    def toggle_block(self, layer: int, part: str) -> Marks:
        """Block `part` of `layer` marked (the layer's whole mark gives way), or unmarked."""
        block = (layer, part)
        if block in self.blocks:
            return Marks(self.layers, self.blocks - {block})
        return Marks(self.layers - {layer}, self.blocks | {block})

    def within(self, n_layers: int) -> Marks:
        """The marks of a model with `n_layers` layers (a saved mark beyond them is dropped)."""
        return Marks(frozenset(layer for layer in self.layers if layer < n_layers),
                     frozenset(block for block in self.blocks if block[0] < n_layers))

    def layer_text(self) -> str:
        return ", ".join(f"L{layer}" for layer in self.sorted_layers)

    def block_text(self) -> str:
        return ", ".join(f"L{layer}.{SHORT[part]}" for layer, part in self.sorted_blocks)

    def describe(self) -> str:
        """What the modified model changes, e.g. `L3 neighbour mean · L5.attn, L11.mlp removed`;
        '' when nothing is marked."""
        said = [f"{self.layer_text()} neighbour mean"] if self.layers else []
        said += [f"{self.block_text()} removed"] if self.blocks else []
        return " · ".join(said)

    def to_json(self) -> dict[str, Any]:
        return {"layers": list(self.sorted_layers), "blocks": [list(block) for block in self.sorted_blocks]}

    @classmethod
    def from_json(cls, doc: Any) -> Marks:
        """The marks in `doc` (as `to_json` writes them); ValueError when anything in it does not
        check: a layer that is not a whole number from 0, a part other than attention or mlp, a
        layer marked whole and by a block, too many marks."""
        if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list) or not isinstance(
                doc.get("blocks"), list):
            raise ValueError("marks: not {'layers': [...], 'blocks': [...]}")
        layers, blocks = doc["layers"], doc["blocks"]
        if len(layers) + len(blocks) > MAX_MARKS:
            raise ValueError(f"marks: more than {MAX_MARKS}")
        if not all(_layer(layer) for layer in layers):
            raise ValueError("marks: a layer is not a whole number from 0")
        if not all(isinstance(block, list) and len(block) == 2 and _layer(block[0]) and block[1] in PARTS
                   for block in blocks):
            raise ValueError("marks: a block is not [layer, 'attention' or 'mlp']")
        marks = cls(frozenset(layers), frozenset((layer, part) for layer, part in blocks))
        if any(layer in marks.layers for layer, _ in marks.blocks):
            raise ValueError("marks: a layer marked whole and by a block")
        return marks


NO_MARKS = Marks()


def _layer(value: Any) -> bool:
    return type(value) is int and value >= 0
