"""How a new circuit differs from a recorded one, operator by operator.

This is the comparison an upgrade (issue 16: change a running pipeline's views without starting
over) rests on. Node ids are positions in a circuit's declaration, so they shift when a view is
added or removed before others; what identifies an operator across two circuits is its
*structural fingerprint*: a digest of its op, its parameters and its inputs' fingerprints
(recursively down to the inputs and constants), never its id. Two nodes with the same
fingerprint compute the same collection from the same inputs, so a stateful operator whose
fingerprint is kept can keep its traces as they are, and only the others need a backfill.

Contract of ``diff(old, new)`` (both ``Circuit.describe()`` dicts):

* ``kept`` maps each new node to an old node with the same fingerprint (when a circuit holds
  several equal nodes, they pair in declaration order, so the pairing is deterministic);
* ``added`` are the new nodes without such an old node (a stateful one starts empty and must be
  backfilled from the input logs); ``retired`` are the old nodes no new node kept;
* outputs are ``unchanged`` (same name, same fingerprint), ``changed`` (same name, another
  fingerprint: the next step must emit the difference of the old and new contents), ``added``
  (emit the full contents) or ``removed`` (its output log is retired);
* an input whose schema changed is refused (``CircuitChangedError``): its log holds rows of the
  old schema. Inputs may be added (empty history) or dropped (the log is kept).

Pure: reads descriptions, touches no storage.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dbsp_pipeline.errors import CircuitChangedError

#: parameters that name another node by id (``conform``'s ``like``): fingerprinted by that
#: node's fingerprint, not its id
NODE_REFERENCES = {"conform": ("like",)}


def node_fingerprints(description: Mapping[str, Any]) -> dict[int, str]:
    """Every node's structural fingerprint (hex SHA-256), by node id."""
    nodes = {n["id"]: n for n in description["nodes"]}
    prints: dict[int, str] = {}
    for node_id in sorted(nodes):  # a node's inputs and references are declared before it
        node = nodes[node_id]
        params = dict(node["params"])
        for key in NODE_REFERENCES.get(node["op"], ()):
            params[key] = prints[params[key]]
        if node["op"] == "input":
            params["schema"] = _normalized(params["schema"])
        text = json.dumps({"op": node["op"], "params": params,
                           "inputs": [prints[i] for i in node["inputs"]]},
                          sort_keys=True, separators=(",", ":"))
        prints[node_id] = hashlib.sha256(text.encode()).hexdigest()
    return prints


@dataclass(frozen=True)
class CircuitDiff:
    """What ``diff`` found; node ids are the new circuit's (``kept`` values, ``retired``: the
    old one's)."""

    kept: dict[int, int]
    added: list[int]
    retired: list[int]
    outputs_unchanged: list[str]
    outputs_changed: list[str]
    outputs_added: list[str]
    outputs_removed: list[str]

    @property
    def unchanged(self) -> bool:
        """Whether the circuits compute the same views the same way (nothing to upgrade)."""
        return not (self.added or self.retired or self.outputs_changed or self.outputs_added
                    or self.outputs_removed)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (what an upgrade records with its checkpoint)."""
        return {"kept": {str(k): v for k, v in sorted(self.kept.items())},
                "added": self.added, "retired": self.retired,
                "outputs": {"unchanged": self.outputs_unchanged,
                            "changed": self.outputs_changed, "added": self.outputs_added,
                            "removed": self.outputs_removed}}


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> CircuitDiff:
    """How circuit description ``new`` differs from ``old``; see the module docstring."""
    _refuse_input_schema_changes(old, new)
    old_prints, new_prints = node_fingerprints(old), node_fingerprints(new)
    unpaired: dict[str, list[int]] = {}
    for node_id in sorted(old_prints):
        unpaired.setdefault(old_prints[node_id], []).append(node_id)
    kept: dict[int, int] = {}
    added: list[int] = []
    for node_id in sorted(new_prints):
        candidates = unpaired.get(new_prints[node_id])
        if candidates:
            kept[node_id] = candidates.pop(0)
        else:
            added.append(node_id)
    retired = sorted(i for ids in unpaired.values() for i in ids)
    old_out, new_out = old["outputs"], new["outputs"]
    same = [n for n in new_out if n in old_out
            and new_prints[new_out[n]] == old_prints[old_out[n]]]
    return CircuitDiff(
        kept=kept, added=added, retired=retired,
        outputs_unchanged=same,
        outputs_changed=[n for n in new_out if n in old_out and n not in same],
        outputs_added=[n for n in new_out if n not in old_out],
        outputs_removed=[n for n in old_out if n not in new_out])


def _input_schemas(description: Mapping[str, Any]) -> dict[str, str]:
    nodes = {n["id"]: n for n in description["nodes"]}
    return {name: nodes[i]["params"]["schema"] for name, i in description["inputs"].items()}


def _refuse_input_schema_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    before, after = _input_schemas(old), _input_schemas(new)
    for name in sorted(set(before) & set(after)):
        if _normalized(before[name]) != _normalized(after[name]):
            raise CircuitChangedError(
                f"input '{name}' changes its schema from ({before[name]}) to ({after[name]}): "
                "its input log holds rows of the old schema, and changing an input's schema is "
                "not supported; declare a new input (and drop the old one) instead")


def _normalized(schema: str) -> str:
    """A DDL schema with its whitespace collapsed, so layout alone is not a change."""
    return " ".join(schema.replace(",", ", ").split()).replace(" ,", ",")
