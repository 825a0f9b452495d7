"""The dynamics view's clusters: the token groups PCA and KMeans found in the per-token angle
profiles, with their sizes, most frequent tokens and typical examples."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def clusters_table(doc: dict[str, Any]) -> Table:
    """results/dynamics.json `pca.clusters`, largest (the bulk) first."""
    pca = doc.get("pca") or {}
    explained = ", ".join(f"{100 * share:.0f}%" for share in (pca.get("explained") or [])[:3])
    table = Table(title=f"token clusters (k={pca.get('k', '?')}; PCA explains {explained or '?'})", expand=False)
    for column in ("cluster", "size", "share", "top tokens", "typical examples"):
        table.add_column(column, justify="right" if column in ("size", "share") else "left")
    for row in pca.get("clusters", []):
        tokens = " ".join(f"{word!r}×{count}" for word, count in row.get("top_tokens", []))
        examples = " | ".join(str(e).replace("\n", " ") for e in row.get("examples", []))[:80]
        table.add_row(
            "bulk" if row.get("bulk") else str(row.get("label")),
            f"{row['size']:,}",
            f"{100 * row['fraction']:.1f}%",
            tokens,
            examples,
        )
    return table
