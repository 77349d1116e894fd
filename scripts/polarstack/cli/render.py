"""How every report looks to a person: one `render_<report>` per report (rich tables), plus the JSON printer.

The commands in cli*.py compute a report and hand it here (or to `print_json` under --json). Every table and line
fits WIDTH columns (a narrower terminal: its width): cells wrap at spaces and are never cut; a value that would not
fit (a URL, a package spec, a range) is shortened here, or the table is split in two (tests/unit/cli/test_table_width.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from polarstack.bench import matrix
from polarstack.bench.compare import spread
from polarstack.train.preflight import seven_b_line


def progress_bar():
    """The bar of long commands (`routers matrix`, `tasks verify`): description, bar, n/total, elapsed, on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


WIDTH = 100  # the widest a table or a line is drawn (issue 34): a terminal of 100 columns, a log read in one


def console():
    from rich.console import Console

    width = min(Console().width, WIDTH) if sys.stdout.isatty() else WIDTH
    return Console(highlight=False, soft_wrap=False, width=width)


def _table(*headers: str, **options):
    """A table whose cells wrap at spaces; a word longer than its column would be folded (the test says so)."""
    from rich.table import Table

    table = Table(**options)
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def print_table(out, table) -> None:
    """Print `table` within `out`'s width with no word cut. Rich shrinks every wrapping column in proportion and so
    folds words that a better split would keep whole: each column gets its longest word, and the room left goes to
    the columns whose cells would wrap, in proportion to what they lack. A table whose longest words alone are wider
    than the console is printed as rich draws it (folded; tests/unit/cli/test_table_width.py names such a table)."""
    columns = table.columns
    texts = [[str(column.header), *(str(cell) for cell in column.cells)] for column in columns]
    longest_word = [max((len(w) for text in col for w in text.split()), default=1) for col in texts]
    longest_line = [max(len(line) for text in col for line in (text.splitlines() or [""])) for col in texts]
    room = out.width - (3 * len(columns) + 1)  # each column's padding and rule, and the table's left edge
    spare = room - sum(longest_word)
    if sum(longest_line) > room and spare >= 0:
        lacking = [line - word for word, line in zip(longest_word, longest_line, strict=True)]
        widths = [word + lack * spare // sum(lacking) for word, lack in zip(longest_word, lacking, strict=True)]
        for index in sorted(range(len(widths)), key=lambda i: longest_line[i] - widths[i], reverse=True):
            if sum(widths) < room and widths[index] < longest_line[index]:
                widths[index] += 1  # what the rounding left over
        for column, width in zip(columns, widths, strict=True):
            column.width = width
    out.print(table)


def render_smoke(report) -> None:
    out = console()
    res = report.resolution
    out.print(f"smoke: route={res.route} base={res.base_url} model={report.model}")
    if res.note:
        out.print(f"  path: {res.note}")
    # Each URL once, outside the table (one URL is a word of 35-45 characters): above it when every request went to
    # the same one, else below it with the requests that went there; each problem once, below it, the same way.
    urls: dict[str, list[str]] = {}
    said: dict[str, list[str]] = {}
    table = _table("#", "kind", "turn", "HTTP", "ms", "prompt ids", "response ids", "trainable", "problems")
    for index, entry in enumerate(report.exchanges, 1):
        verdict = entry.get("verdict", {})
        found = verdict.get("problems", [])
        urls.setdefault(entry["url"], []).append(str(index))
        for problem in found:
            said.setdefault(problem["message"], []).append(str(index))
        table.add_row(
            str(index),
            entry["kind"],
            str(entry["turn"]),
            str(entry["status"]),
            f"{entry['elapsed_ms']:.1f}",
            str(verdict.get("prompt_tokens", "-")),
            str(verdict.get("response_tokens", "-")),
            str(entry.get("polar", {}).get("polar_trainable_tokens", "-")),
            str(len(found)) if found else "-",
        )
    if len(urls) == 1:
        out.print(f"  requests to {next(iter(urls))}")
    if report.exchanges:
        print_table(out, table)
    if len(urls) > 1:
        for url, indexes in urls.items():
            out.print(f"  #{', #'.join(indexes)} went to {url}")
    for message, indexes in said.items():
        out.print(f"  problem of #{', #'.join(indexes)}: {message}")
    for row in report.per_engine or []:  # NODES>1: every engine of every node (checks.per_engine)
        outcome = "pass" if row["verdict"] == "pass" else f"FAIL ({row['code']}): {row['message']}"
        out.print(
            f"  node {row['rank']} ({row['addr']}) engine {row['url']}: {row['trainable_tokens']} trainable tokens, "
            f"{outcome}"
        )
    for node in report.per_node or []:
        out.print(
            f"  node {node['rank']} ({node['addr']}): {node['trainable_tokens']} trainable tokens from "
            f"{node['engines']} engine(s)" + (f", failing: {', '.join(node['failed'])}" if node["failed"] else "")
        )
    for warning in report.warnings:
        out.print(f"  warning: {warning}")
    verdict = "PASS" if report.ok else f"FAIL ({report.code.name}, exit {int(report.code)})"
    out.print(
        f"verdict: {verdict}; Polar's verdict {report.polar_verdict or '-'}; trainable tokens "
        f"{report.trainable_tokens}; {report.elapsed:.3f} s"
    )


def render_docker_smoke(report: dict[str, Any], profile_name: str) -> None:
    """A short human report of the trainer's smoke JSON (`--json` prints it whole)."""
    verdict = "PASS" if report["verdict"] == "pass" else f"FAIL ({report.get('code')}, exit {report.get('exit_code')})"
    print(
        f"smoke inside the trainer of {profile_name}: route={report.get('route')} base={report.get('base_url')} "
        f"model={report.get('model')}"
    )
    for entry in report.get("requests") or []:
        polar = entry.get("polar", {}).get("polar_trainable_tokens", "-")
        installed = entry.get("installed_polar", {}).get("trainable_tokens", "-")
        print(
            f"  {entry.get('kind')} turn {entry.get('turn')} {entry.get('url')} HTTP {entry.get('status')}: "
            f"trainable {polar}, installed Polar {installed}"
        )
    for warning in report.get("warnings") or []:
        print(f"  warning: {warning}")
    print(
        f"verdict: {verdict}; Polar's verdict {report.get('polar_verdict') or '-'}; installed Polar "
        f"{report.get('installed_polar')}; trainable tokens {report.get('trainable_tokens')}"
    )
    sys.stdout.flush()


def render_probe(report) -> None:
    table = _table("path", "url", "HTTP", "bytes", "choices[0] keys", "trainable")
    for label, side in (("direct", report.direct), ("via", report.via)):
        if side:
            table.add_row(
                label,
                side["url"].split("://", 1)[-1],
                str(side["status"]),
                str(side["bytes"]),
                ", ".join(side["choice_keys"]),
                str(side["trainable_tokens"]),
            )
    out = console()
    print_table(out, table)
    out.print(f"diagnosis: {report.diagnosis}" + (f" ({report.evidence})" if report.evidence else ""))


def render_local_up(state, profile, found) -> str:
    """The line `polarstack up` ends with: the profile, where (this node of NODES>1), its engines, Polar's base URL."""
    where = f"on node {found.rank} of {found.nodes} ({found.addr}, " if found.multi else "locally ("
    return (
        f"{profile.name} is up {where}{state.engine} engines); Polar's base URL: {state.base_url} "
        f"(route {profile.route}); state in {state.path}"
    )


def render_status(state) -> None:
    """`polarstack status` of a recorded local stack (local.LocalState)."""
    live = state.live()
    for proc in state.processes:
        alive = "running" if proc in live else "gone"
        print(f"{proc['role']:10} pid {proc['pid']:>7} {proc['url']} {alive}")
    print(f"profile {state.profile}: base URL {state.data.get('base_url')}")


def render_demo(rows: list[dict[str, Any]], elapsed: float, engine: str = "emulator") -> None:
    title = "engines: the emulator (CPU stand-in)" if engine == "emulator" else f"engines: real {engine} on the CPU"
    table = _table("profile", "router release", "verdict", "trainable tokens", "smoke s", "as expected", title=title)
    for row in rows:
        table.add_row(
            row["profile"],
            row["router"],
            row["verdict"],
            str(row["trainable_tokens"]),
            "-" if row.get("smoke_seconds") is None else f"{row['smoke_seconds']:.3f}",
            "yes" if row["as_expected"] else f"NO (expected {row['expected']})",
        )
    out = console()
    print_table(out, table)
    rehearsed = [row for row in rows if row.get("rehearsal")]
    if rehearsed:  # make preflight's report, the classes this machine can measure (the rest: the node's)
        classes = [v["class"] for v in rehearsed[0]["rehearsal"]]
        part = _table("rehearsal class (make preflight)", *[row["profile"] for row in rehearsed])
        for index, name in enumerate(classes):
            part.add_row(name, *[_rehearsal_cell(r["rehearsal"][index]) for r in rehearsed])
        print_table(out, part)
    out.print(f"demo finished in {elapsed:.1f} s")


def render_docker_demo_note(result: dict[str, Any]) -> None:
    """`make demo RUNTIME=docker`'s closing note: cold or warm, its time, the data root's disk use, peak memory."""
    kind = "cold (bases or images built)" if result.get("cold") else "warm (bases and images cached)"
    disk = result.get("data_root_bytes")
    disk_text = f"{disk / 1e9:.1f} GB" if disk else "not measured (not the private engine of `make dockerd`)"
    console().print(
        f"docker demo, {kind}: {result['elapsed_seconds']:.0f} s, of which bases and images "
        f"{result['build_seconds']:.0f} s; Docker data root {disk_text}; peak memory in use on this machine "
        f"{result['peak_memory_bytes'] / 2**30:.1f} GiB"
    )


def _rehearsal_cell(verdict: dict[str, str]) -> str:
    return "node only" if verdict["verdict"] == "node" else f"{verdict['verdict']}: {verdict['figure']}"


def render_train_plan(plan, task: str, profile_name: str, runtime: str, run_dir_in_trainer: str) -> None:
    """`make train DRY_RUN=1`: every command and file of the launch, and what to watch."""
    print(f"# dry run: {task} on profile {profile_name} ({runtime} runtime); nothing is launched")
    print(f"# tasks: polarstack tasks prepare {task} --out .run/train/{plan.run_id}/tasks")
    described = plan.as_dict()
    render_cluster(plan)
    for command in described["commands"]:
        print(command)
    for file_name, text in plan.files.items():
        print(f"# --- {run_dir_in_trainer}/{plan.run_id}/{file_name} ---")
        print(text.rstrip())
    for line in described["watch"]:
        print(f"# on the GPU node, watch: {line}")
    render_memory(plan)

    print(f"# {seven_b_line(plan)}")


def render_cluster(plan) -> None:
    """At NODES>1: what each node runs (polarstack.stack.cluster.layout); nothing on one node."""
    cluster = getattr(plan, "cluster", None)
    if cluster is None or not cluster.multi:
        return
    print(
        f"# cluster: {cluster.nodes} nodes on {cluster.iface}, head {cluster.head_addr}, shared {cluster.shared_dir}; "
        f"the plan is run on rank 0"
    )
    for node in plan.nodes:
        print(
            f"# node {node.rank} ({node.addr}): {', '.join(node.roles)}; engine GPUs "
            f"{','.join(map(str, node.engine_gpus))} ({' '.join(node.engine_urls)}), trainer GPUs "
            f"{','.join(map(str, node.trainer_gpus))}"
        )


def render_memory(plan) -> None:
    """The memory estimate per GPU and per host, term by term (polarstack.train.memory; computed, not measured)."""
    if plan.memory is not None:
        for line in plan.memory.lines():
            print(f"# {line}")


def render_verify(result: dict[str, Any], elapsed: float) -> None:
    print(
        f"{result['passed']}/{result['problems']} canonical {result['task']} solutions pass in the sandbox "
        f"({elapsed:.1f} s)"
    )


def render_bench(data: dict[str, Any], paths: dict[str, Any]) -> None:
    """Two tables sharing the profile column (one would be 150 columns wide): the smoke and token yield, then the
    latency the router adds and the throughput; each cell the median (min-max) of the repetitions."""
    c = data["concurrencies"]
    table = _table("profile", "router", "smoke", "smoke s", "yield")
    for name, row in data["profiles"].items():
        table.add_row(
            name, row["router"], row["smoke_verdict"], spread(row["smoke_seconds"]), spread(row["token_yield"], 2)
        )
    out = console()
    print_table(out, table)
    table = _table("profile", "added median ms", "added p99 ms", *[f"req/s c={x}" for x in c])
    for name, row in data["profiles"].items():
        table.add_row(
            name,
            spread(row["added_median_ms"]),
            spread(row["added_p99_ms"]),
            *[spread(row["throughput"][str(x)], 0) for x in c],
        )
    print_table(out, table)
    affinity = _table("profile", "routing", "cache share", "prompt tokens per engine")
    for name, row in data["profiles"].items():
        for routing, aff in row.get("affinity", {}).items():
            affinity.add_row(name, routing, f"{aff['cache_share']:.3f}", str(aff["per_engine_prompt_tokens"]))
    print_table(out, affinity)
    out.print(f"wrote {paths['markdown']}, {paths['json']}, {paths['plot']}")


def render_routing_bench(data: dict[str, Any], paths: dict[str, Any]) -> None:
    table = _table(
        "profile", "routing mode", "prompt tok % per engine", "affinity %", "cache vs ideal", "turns/s", "goals"
    )
    rows = [("any", "Polar worker bypass", data["bypass"])] + [
        (name, m["label"] + (" (shipped)" if m["shipped"] else ""), m["metrics"])
        for name, row in data["profiles"].items()
        for m in row["modes"]
    ]
    for name, label, m in rows:
        table.add_row(
            name,
            label,
            "/".join(f"{v * 100:.0f}" for v in m["prompt_token_share"]),
            f"{m['session_affinity'] * 100:.1f}",
            f"{m['cache_vs_ideal']:.3f}",
            f"{m['turns_per_s']:.1f}",
            "met" if all(m["goals"].values()) else "missed",
        )
    out = console()
    print_table(out, table)
    out.print(f"wrote {paths['markdown']}, {paths['json']}, {paths['plot']}")


def render_verify_offline(checks, elapsed: float) -> None:
    failed = [c for c in checks if not c.ok]
    table = _table("check", "result")
    for check in checks:
        table.add_row(check.name, "ok" if check.ok else "FAIL: " + "; ".join(check.problems))
    out = console()
    print_table(out, table)
    out.print(f"{len(checks) - len(failed)}/{len(checks)} checks passed in {elapsed:.1f} s")


# The catalog's columns as a person reads them (the keys are --json's); the launch module goes below the table.
CATALOG_COLUMNS = {
    "release": "release",
    "forwards_chat_return_flags": "forwards chat return flags",
    "worker_api": "worker API",
    "startup_check_interval_flag": "startup check interval flag",
    "prometheus_port_flag": "prometheus port flag",
    "prometheus_host_flag": "prometheus host flag",
    "installed": "installed",
}


def render_routers_catalog(rows: list[dict[str, Any]]) -> None:
    table = _table(*CATALOG_COLUMNS.values())
    for row in rows:
        table.add_row(*(_yes_no(row[key]) for key in CATALOG_COLUMNS))
    out = console()
    print_table(out, table)
    modules = {}
    for row in rows:
        modules.setdefault(row["module"], row["release"].partition("==")[0])
    out.print("launched as: " + "; ".join(f"python -m {module} ({package})" for module, package in modules.items()))


def _yes_no(value: Any) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else str(value)


# The matrix in two tables of the release and some of matrix.COLUMNS (one would be 200 columns wide): what each
# release keeps of Polar's token path, then the rest of its behaviour and its timings; the notes below them.
MATRIX_SPLIT = (
    (
        "installs",
        "starts",
        "chat_flags_reach_engine",
        "chat_fields_reach_client",
        "fields_survive_when_emitted",
    ),
    (
        "generate_keeps_tokens",
        "completions_flags_reach_engine",
        "post_workers",
        "startup_s",
        "added_median_ms",
        "added_p99_ms",
    ),
)
# The Markdown's titles, but a slash between two names opened up so the title wraps there (26 characters in one word)
TERMINAL_TITLES = {"chat_fields_reach_client": "prompt_token_ids / meta_info reach client"}


def render_matrix(rows: list[dict[str, Any]]) -> None:
    titles = {**dict(matrix.COLUMNS), **TERMINAL_TITLES}
    out = console()
    for keys in MATRIX_SPLIT:
        table = _table(titles["release"], *(titles[key] for key in keys))
        for row in rows:
            table.add_row(matrix.cell(row, "release"), *(matrix.cell(row, key) for key in keys))
        print_table(out, table)
    for row in rows:
        if row.get("note"):
            out.print(f"note on {row['release']}: {row['note']}")


def render_preflight_plan(plan) -> None:
    """`make preflight DRY_RUN=1`: the rehearsal's model, settings, steps, both jobs' launches and the report path."""
    model = plan.model
    print(f"# dry run: the rehearsal on profile {plan.profile}; nothing is launched")
    print(
        f"# model: {plan.hub_name} (slime scripts/models/qwen2.5-{plan.size}.sh: {model['num_layers']} layers, hidden "
        f"{model['hidden_size']}, {model['num_query_groups']} query groups, vocab {model['vocab_size']}, "
        f"{'tied' if model['tied_embeddings'] else 'untied'} embeddings, {model['parameters']:,} parameters computed)"
    )
    first = plan.phases[0][1].train_args
    value = lambda flag: first[first.index(flag) + 1]  # noqa: E731
    print(
        f"# GRPO: {value('--rollout-batch-size')} prompts x {value('--n-samples-per-prompt')} samples, global batch "
        f"{value('--global-batch-size')}, data-parallel size {plan.data_parallel}, tasks {', '.join(plan.task_ids)}"
    )
    print(f"# report: {plan.report_path}")
    render_cluster(plan.phases[0][1])
    for number, step in enumerate(plan.as_dict()["steps"], 1):
        print(f"# step {number}: {step}")
    render_memory(plan.phases[0][1])
    if plan.seven_b is not None:  # the 7B's parts run the real run's plan: its memory, host terms included
        print("# the 7B's parts (the real run's model and memory plan):")
        for line in plan.seven_b.memory.lines():
            print(f"# {line}")
        print("# the 7B's parts' added time (an estimate from sizes and stated rates, not measured):")
        for term, seconds in plan.seven_b.added_seconds.items():
            print(f"#   {seconds:7.1f} s  {term}")
    for name, phase in plan.phases:
        print(f"# --- job {name} ---")
        print(phase.as_dict()["commands"][-1])
    for file_name, text in plan.files.items():
        print(f"# --- .run/train/{plan.run_id}/{file_name} ---")
        print(text.rstrip())


def render_rehearsal_report(result: dict[str, Any]) -> None:
    """The rehearsal's verdict per silent-failure class (polarstack.checks.rehearsal_report)."""
    table = _table("class", "verdict", "measured", "what to change")
    for row in result["verdicts"]:
        table.add_row(row["class"], row["verdict"].upper(), row["figure"], row["change"])
    print_table(console(), table)
    for warning in result.get("warnings") or []:  # e.g. an active POLARSTACK_VERIFIER_ISOLATION=none
        print(f"WARNING {warning}")
    status = "passed" if result["passed"] else f"FAILED at {result['first_failure']}"
    print(f"rehearsal {status} ({result.get('profile', '?')}, {result.get('plan', '?')})")
