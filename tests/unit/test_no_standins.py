"""No stand-in of one of our own services in tests/integration or tests/e2e.

A test there talks to the real sibling services (started in a thread, tests/service_thread.py,
or as the stack); a service's own logic against small fakes of its own ports is a unit test
(tests/unit), and the gRPC machinery against fake servers is a mechanics test
(tests/mechanics). This guard reads the test sources (no import, no socket) and names every
class there that

* subclasses a generated ``couler.v1`` servicer (``...Servicer``),
* is named ``StandIn...``, or ``Fake...`` after one of our services, or
* serves one of our services' RPCs by hand: a method named as a ``couler.v1`` RPC
  taking ``(self, request, context)``;

and every place where a test builds an answer one of our services gives -- a plan
(``WorkflowOptimized``, ``plan_to_proto``), a refusal (``WorkflowRejected``), a generated
workflow (``WorkflowGenerated``, ``GenerateResponse``), a cache lookup (``LookupResponse``)
-- rather than getting it from the real service.
"""

from __future__ import annotations

import ast
from pathlib import Path

from couler.v1 import (
    cache_service_pb2,
    generator_service_pb2,
    monitor_service_pb2,
    optimizer_service_pb2,
    submitter_service_pb2,
)

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("integration", "e2e")
SERVICES = ("Generator", "Optimizer", "Cache", "Submitter", "Monitor")
#: Answers only our services give: a test that builds one plays that service.
ANSWERS = frozenset({"WorkflowOptimized", "WorkflowRejected", "WorkflowGenerated",
                     "plan_to_proto", "GenerateResponse", "LookupResponse"})


def rpc_names() -> frozenset[str]:
    """Every RPC of our five services (from the generated descriptors)."""
    return frozenset(
        method.name
        for module in (cache_service_pb2, generator_service_pb2, monitor_service_pb2,
                       optimizer_service_pb2, submitter_service_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods)


def _serves_by_hand(node: ast.ClassDef, rpcs: frozenset[str]) -> list[str]:
    found = []
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in rpcs:
            args = [a.arg for a in item.args.args]
            if len(args) == 3 and args[2] in {"context", "ctx", "_context"}:
                found.append(item.name)
    return found


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else ""


def standins(source: str, rpcs: frozenset[str] | None = None) -> list[tuple[int, str, str]]:
    """(line, name, why) for each stand-in of one of our services in ``source``."""
    rpcs = rpc_names() if rpcs is None else rpcs
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _called(node) in ANSWERS:
            found.append((node.lineno, _called(node), "builds an answer of our services"))
            continue
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(b) for b in node.bases]
        servicers = [b for b in bases if b.endswith("Servicer")]
        if servicers:
            found.append((node.lineno, node.name, f"subclasses {', '.join(servicers)}"))
        elif node.name.startswith("StandIn"):
            found.append((node.lineno, node.name, "named StandIn*"))
        elif node.name.startswith("Fake") and any(s in node.name for s in SERVICES):
            found.append((node.lineno, node.name, "named Fake* after one of our services"))
        elif hand := _serves_by_hand(node, rpcs):
            found.append((node.lineno, node.name, f"serves {', '.join(hand)} by hand"))
    return found


def test_no_standin_of_our_services_in_integration_or_e2e() -> None:
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{line}: {name} ({why})"
        for folder in SCANNED
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, name, why in standins(path.read_text())]
    assert not offenders, (
        "stand-ins of our own services (use the real service, or move the test to "
        "tests/unit with a fake of the service's own port):\n" + "\n".join(offenders))


def test_the_guard_finds_each_kind_of_standin() -> None:
    """The scanner itself: each kind is found, and a fake of an outside system is not."""
    source = '''
class A(cache_service_pb2_grpc.CacheServiceServicer):
    pass
class StandInCache:
    pass
class FakeSubmitterServer:
    pass
class Handmade:
    async def Lookup(self, request, context):
        return None
class FakeKube:  # an outside system
    def Get(self, path):
        return None
class RecordingAdapter:  # an engine
    def submit(self, request, context):
        return None
plan = events_pb2.WorkflowOptimized(run_id="r", plan=plan_to_proto(p))
reading = events_pb2.WorkflowOptimized.FromString(data)  # reading an answer is fine
'''
    found = sorted((line, name, why.split()[0]) for line, name, why in standins(source))
    assert [(name, why) for _, name, why in found] == [
        ("A", "subclasses"), ("StandInCache", "named"), ("FakeSubmitterServer", "named"),
        ("Handmade", "serves"), ("WorkflowOptimized", "builds"), ("plan_to_proto", "builds")]
    assert {"Lookup", "Optimize", "Submit", "Generate", "Recommendations"} <= rpc_names()
