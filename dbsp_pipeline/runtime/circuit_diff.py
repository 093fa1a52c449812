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

``state_names`` then gives each node of the new circuit the name its state tables go by: a kept
node its old node's (``positional_state_names`` for a root that recorded none), any other a
fresh one that no old or new node uses.

Pure: reads descriptions, touches no storage.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
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


#: nodes ``plan.make_operator`` gives no name: an input is no operator, a constant keeps its
#: rows in the circuit
UNNAMED_OPS = frozenset({"input", "constant"})


def positional_state_name(node_id: int, op: str) -> str:
    """The name of node ``node_id``'s state tables (their prefix) as ``plan.make_operator``
    gives it when no upgrade named it otherwise: ``n<id>_<op>``."""
    return f"n{node_id}_{op}"


def positional_state_names(description: Mapping[str, Any]) -> dict[int, str]:
    """``positional_state_name`` of every named node of ``description``, by node id: the names
    of a root that recorded no name map."""
    return {n["id"]: positional_state_name(n["id"], n["op"]) for n in description["nodes"]
            if n["op"] not in UNNAMED_OPS}


#: the checkpoint metadata key of the state names of a circuit an upgrade installed (absent:
#: positional names, ``positional_state_names``)
STATE_NAMES_KEY = "state_names"


def names_to_json(names: Mapping[int, str]) -> dict[str, str]:
    """``names`` as a checkpoint records them (JSON object keys are strings)."""
    return {str(k): v for k, v in sorted(names.items())}


def names_from_json(recorded: Mapping[str, str] | None,
                    description: Mapping[str, Any]) -> dict[int, str]:
    """The state names a checkpoint recorded (``names_to_json``) for the circuit
    ``description``; positional names when it recorded none."""
    if recorded is None:
        return positional_state_names(description)
    return {int(k): str(v) for k, v in recorded.items()}


def state_names(change: CircuitDiff, new: Mapping[str, Any], old_names: Mapping[int, str],
                in_use: Iterable[str] = ()) -> dict[int, str]:
    """The state name of every node of circuit description ``new`` after an upgrade described by
    ``change``, given ``old_names`` (the old circuit's: a recorded map, or
    ``positional_state_names`` of the old description) and ``in_use``, the names of the state
    tables that exist (the root's ``state/`` folder: a retired node's tables, a retained
    checkpoint of an earlier circuit's, what a crashed upgrade left).

    A kept node keeps its old node's name, so it reads the same tables, untouched. Any other
    node gets ``n<id>_<op>``, or ``n<id>_<op>_u<k>`` with the smallest ``k`` that makes it
    clash with no old name, no table in use and no other new name (``TABLE_SUFFIX``: a name
    clashes with a table it would own). So a new node always starts from tables of its own.
    A retired node's tables
    still hold the old circuit's state (a crash before the upgrade commits, or a restore of an
    older checkpoint, reopens an older circuit on them); a table no checkpoint refers to any
    more may have lost the early commits of its Delta log, and so cannot start empty again.
    Deterministic: a function of its arguments alone."""
    taken = {*old_names.values(), *in_use}  # names and tables; kept nodes' are among them
    nodes = sorted((n for n in new["nodes"] if n["op"] not in UNNAMED_OPS),
                   key=lambda n: n["id"])
    names = {n["id"]: old_names[change.kept[n["id"]]] for n in nodes
             if change.kept.get(n["id"]) in old_names}
    for node in nodes:
        node_id = node["id"]
        if node_id in names:
            continue
        base = name = positional_state_name(node_id, node["op"])
        k = 0
        while _clashes(name, taken):
            k += 1
            name = f"{base}_u{k}"
        names[node_id] = name
        taken.add(name)
    return names


#: what follows a node's state name in the names of its tables (``operators/``: a join's
#: ``_left`` and ``_right``, an aggregate's ``_groups``, ``_groups_exact``, either with
#: ``_wide``, and ``_values<i>``; a distinct, top-k or stream operator's one table is its name);
#: never ``_u<k>``
TABLE_SUFFIX = r"(_left|_right|_groups(_exact)?(_wide)?|_values[0-9]+)?"


def table_belongs(name: str, table: str) -> bool:
    """Whether state table ``table`` is one of the tables of the node named ``name``."""
    return re.fullmatch(re.escape(name) + TABLE_SUFFIX, table) is not None


def _clashes(name: str, taken: set[str]) -> bool:
    """Whether state name ``name`` is a name in ``taken`` or owns a table in it."""
    return any(table_belongs(name, t) for t in taken)


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
