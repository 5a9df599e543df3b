"""Pure dataflow state of one token in one plan: which nodes are ready, which are skipped.

No I/O, no awaits: the executor reports events and gets back node indexes to start::

    flow = Flow(plan)
    ready = flow.start(present_keys)           # graph inputs given by the request
    ready = flow.finish(node_index, produced)  # a node finished with these output names
    flow.done                                  # every graph output is decided

A tensor key is *decided* once it is present or known to be absent (its producer was skipped,
or finished without it, as a switch does for the branches it does not take). A binding with
several candidates takes the first present one, in order, once the earlier ones are decided.
A node whose required binding is absent is skipped, and its outputs become absent in turn.
"""

from __future__ import annotations

from collections.abc import Container

from flowserve.graph.plan import Plan


class Flow:
    __slots__ = ("_absent", "_decided_outputs", "_pending", "_plan", "_present", "chosen", "skipped")

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._present: set[str] = set()
        self._absent: set[str] = set()
        # per node: number of bindings not yet decided
        self._pending = [len(n.bindings) for n in plan.nodes]
        self._decided_outputs: set[str] = set()
        # per node: node input name -> the key it takes (filled as bindings decide)
        self.chosen: list[dict[str, str]] = [{} for _ in plan.nodes]
        self.skipped: list[str] = []

    def copy(self) -> Flow:
        """An independent copy (a decoupled node's responses each continue a copy)."""
        other = Flow.__new__(Flow)
        other._plan = self._plan
        other._present = set(self._present)
        other._absent = set(self._absent)
        other._pending = list(self._pending)
        other._decided_outputs = set(self._decided_outputs)
        other.chosen = [dict(c) for c in self.chosen]
        other.skipped = list(self.skipped)
        return other

    @property
    def done(self) -> bool:
        return len(self._decided_outputs) == len(self._plan.outputs)

    def start(self, present: Container[str]) -> list[int]:
        """Graph inputs given (as ``$name`` keys); every other graph input is absent."""
        ready: list[int] = [n.index for n in self._plan.nodes if not n.bindings]
        keys = [f"${name}" for name in self._plan.inputs]
        for key in keys:
            self._decide(key, key in present, ready)
        return self._settle(ready)

    def finish(self, index: int, produced: Container[str]) -> list[int]:
        """Node ``index`` finished; ``produced`` holds the names of its outputs that exist."""
        node = self._plan.nodes[index]
        ready: list[int] = []
        for out in node.outputs:
            self._decide(f"{node.name}.{out}", out in produced, ready)
        return self._settle(ready)

    def present(self, key: str) -> bool:
        return key in self._present

    def _decide(self, key: str, present: bool, ready: list[int]) -> None:
        if key in self._present or key in self._absent:
            return
        (self._present if present else self._absent).add(key)
        plan = self._plan
        if key in plan.output_keys:
            for out in plan.outputs:
                if key in out.keys and self._pick(out.keys) is not None:
                    self._decided_outputs.add(out.name)
        for index in plan.consumers.get(key, ()):
            node = plan.nodes[index]
            chosen = self.chosen[index]
            for in_name, candidates in node.bindings:
                if in_name in chosen or key not in candidates:
                    continue
                pick = self._pick(candidates)
                if pick is not None:
                    chosen[in_name] = pick
                    self._pending[index] -= 1
                    if self._pending[index] == 0:
                        ready.append(index)

    def _pick(self, candidates: tuple[str, ...]) -> str | None:
        """The first present candidate once all before it are absent; "" if all are absent;
        None while undecided."""
        for key in candidates:
            if key in self._present:
                return key
            if key not in self._absent:
                return None
        return ""

    def _settle(self, ready: list[int]) -> list[int]:
        """Skip ready nodes that miss a required input (cascading); return the runnable ones."""
        runnable: list[int] = []
        while ready:
            index = ready.pop(0)
            node = self._plan.nodes[index]
            chosen = self.chosen[index]
            if any(chosen[k] == "" and k not in node.optional for k, _ in node.bindings):
                self.skipped.append(node.name)
                for out in node.outputs:
                    self._decide(f"{node.name}.{out}", False, ready)
            else:
                runnable.append(index)
        return runnable

    def output_key(self, keys: tuple[str, ...]) -> str:
        """The key a graph output takes ("" when absent)."""
        return self._pick(keys) or ""
