"""What the smoke is given, as two frozen objects: `SmokeOptions`, how the check runs, and `SmokeTarget`, what it
checks (checks.smoke.run_smoke(target, options)).

The options are built once where the run starts (the CLI from its arguments, the gate and the demos from their
own inputs) and read by each layer as it needs them, as sglang's `ServerArgs` is (sglang/srt/server_args.py: one
dataclass with the defaults written once, `add_cli_args(parser)` and `from_cli_args(args)`). The defaults live
here only: `add_arguments` gives the smoke's command-line flags the same defaults and help, and `to_argv` turns the
options back into those flags for the smoke run inside the trainer (checks.docker_smoke.trainer_command).

The target describes the site: the URL Polar's requests go to, the route, the engines behind it, the registration
the check needs, and what the runtime knows about its engines (the scripted tool answer of a real engine, the
plan's agent environment); it is resolved by the caller (stack.target, stack.local), never here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polarstack.checks import retokenize
from polarstack.inputs import MAX_REQUESTS, MAX_TOKENS, MAX_TURNS, count, seconds
from polarstack.stack import real_sglang


@dataclass(frozen=True)
class SmokeKnobs:
    """The smoke's environment knobs (docs/tool-calls.md; checks.tool_exchange names and judges them), as the caller
    read them: the CLI from its environment, `make train`'s gate, the demos and the benches from the profile's
    settings (the environment, resolved when the profile was loaded: stack.profiles.ENVIRONMENT_KNOBS), the in-job
    gate from the job's environment (tool_exchange.knobs_from). Each is the raw text, "" when unset, judged where the
    smoke uses it, so a bad value fails where and as it always did. Not flags: to_argv leaves them out, and the
    smoke inside the trainer reads the trainer's own environment."""

    tool_pad: str = ""  # POLARSTACK_SMOKE_TOOL_PAD: "0" sends only the unpadded tool request
    tool_max_tokens: str = ""  # POLARSTACK_SMOKE_TOOL_MAX_TOKENS: the tool requests' max_tokens
    timeout: str = ""  # POLARSTACK_SMOKE_TIMEOUT: every smoke request's deadline, in seconds
    agent_request: str = ""  # POLARSTACK_SMOKE_AGENT_REQUEST: the agent CLI's captured request (engine.agent_turn)


@dataclass(frozen=True)
class SmokeOptions:
    """How the smoke runs; every default is written here and nowhere else."""

    model: str | None = None  # the model name requests carry (None: the first id of GET /v1/models)
    requests: int = 2  # single-turn requests
    turns: int = 2  # turns of the multi-turn session (0 skips it)
    timeout: float = 10.0  # seconds per request, in total; a stack of real CPU engines asks more (the caller's)
    max_tokens: int = 16  # max_tokens of each plain request
    strict: bool = False  # findings Polar does not enforce fail with INVARIANT
    allow_retokenized: bool = False  # pass when Polar trains only on ids its builder re-tokenizes
    polar_config: str | None = None  # the guarded Polar config's path (--polar-config), when the CLI was given one
    # the builder tokenizer (None: no re-tokenization); from_args reads it from polar_config, else from the template
    # this stack renders (checks.retokenize.configured_name)
    tokenizer_name: str | None = None
    knobs: SmokeKnobs = SmokeKnobs()  # the smoke's environment knobs, as the caller read them (SmokeKnobs)

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        """The smoke's own flags on `parser` (cli.main's smoke parser). --timeout's parser default is None, not
        the default above: without the flag the target decides (a stack of real CPU engines needs
        real_sglang.SMOKE_TIMEOUT), and from_args fills in the default otherwise."""
        defaults = cls()
        parser.add_argument(
            "--model", default=defaults.model, help="model name to send (default: first id of GET /v1/models)"
        )
        parser.add_argument(
            "--requests",
            type=count(0, MAX_REQUESTS),
            default=defaults.requests,
            help=f"single-turn requests (default {defaults.requests}, at most {MAX_REQUESTS})",
        )
        parser.add_argument(
            "--turns",
            type=count(0, MAX_TURNS),
            default=defaults.turns,
            help=f"turns of the multi-turn session (default {defaults.turns}; 0 skips it; at most {MAX_TURNS})",
        )
        parser.add_argument(
            "--timeout",
            type=seconds,
            default=None,
            help=f"seconds per request, in total (default {defaults.timeout:g}; {real_sglang.SMOKE_TIMEOUT:g} "
            "against a local stack of real CPU engines)",
        )
        parser.add_argument(
            "--max-tokens",
            type=count(1, MAX_TOKENS),
            default=defaults.max_tokens,
            help=f"max_tokens per request (default {defaults.max_tokens})",
        )
        parser.add_argument(
            "--strict",
            action="store_true",
            help="fail (exit 4) on findings Polar does not enforce: usage mismatch, positive logprobs, coerced "
            "id types, aligned-prefix training, extra choices",
        )
        parser.add_argument(
            "--allow-retokenized",
            action="store_true",
            help="pass when Polar would train only on ids its builder re-tokenizes from text (exit 15 otherwise)",
        )
        parser.add_argument(
            "--polar-config",
            default=defaults.polar_config,
            metavar="PATH",
            help="the Polar config the smoke guards (slime's --custom-config-path, e.g. a rendered "
            "polar_config.yaml): its builder tokenizer decides whether Polar re-tokenizes; default: the "
            "template this stack renders (no tokenizer)",
        )

    @classmethod
    def from_args(cls, namespace: Any, knobs: SmokeKnobs = SmokeKnobs()) -> SmokeOptions:
        """The options of a parsed smoke command line (the parser add_arguments filled), with the `knobs` the CLI
        read from its environment; reads --polar-config for its builder tokenizer (a StackError, USAGE, when it
        cannot be read)."""
        config = namespace.polar_config
        return cls(
            model=namespace.model,
            requests=namespace.requests,
            turns=namespace.turns,
            timeout=cls().timeout if namespace.timeout is None else namespace.timeout,
            max_tokens=namespace.max_tokens,
            strict=namespace.strict,
            allow_retokenized=namespace.allow_retokenized,
            polar_config=config,
            tokenizer_name=retokenize.configured_name(retokenize.read_config(config) if config else None),
            knobs=knobs,
        )

    def to_argv(self) -> list[str]:
        """These options as the smoke's flags (from_args of their parse gives them back, all but the knobs). The
        counts and the timeout are always written, so the smoke that reads them (inside the trainer) applies no
        default of its own; the tokenizer travels as the Polar config it was read from (without one, the side that
        parses the flags reads the template this stack renders, as from_args does). The knobs are no flags: the
        smoke inside the trainer reads the trainer's own environment (SmokeKnobs)."""
        if self.polar_config is None and self.tokenizer_name != retokenize.configured_name(None):
            raise ValueError(
                f"SmokeOptions.to_argv: tokenizer_name {self.tokenizer_name!r} has no flag of its own; it is read "
                "from --polar-config, so set polar_config to the file that names it"
            )
        argv = [
            "--requests",
            str(self.requests),
            "--turns",
            str(self.turns),
            "--timeout",
            repr(float(self.timeout)),
            "--max-tokens",
            str(self.max_tokens),
        ]
        if self.model:
            argv += ["--model", self.model]
        if self.strict:
            argv.append("--strict")
        if self.allow_retokenized:
            argv.append("--allow-retokenized")
        if self.polar_config:
            argv += ["--polar-config", self.polar_config]
        return argv


@dataclass(frozen=True)
class SmokeTarget:
    """What the smoke checks: the site, as the caller resolved it (stack.target.Target, stack.local's state)."""

    base_url: str  # where Polar's requests go: the router or engine-0
    route: str = "base"  # base: every request to base_url; polar: resolve like Polar's InferenceClient (checks.route)
    register: list[str] | None = None  # engines to register with the router for the check (worker_api.registered)
    engine_urls: list[str] | None = None  # the engines behind base_url, for the re-tokenization drift measurement
    # on a cluster (NODES>1): every node's engines ({"rank", "addr", "engine_urls"}) for checks.per_engine
    nodes: list[dict[str, Any]] | None = None
    agent_env: dict[str, str] | None = None  # the plan's agent.env: its output cap sets the tool request's max_tokens
    # fields added to the tool request only: the real engine's scripted tool answer (local.LocalState.tool_fields)
    tool_fields: dict[str, Any] | None = None
    # why tool_fields cannot reach the engine (local.LocalState.tool_unscripted): the tool outcome is then not judged
    tool_unscripted: str | None = None

    @property
    def drift_engines(self) -> list[str]:
        """The engine-direct URLs the drift measurement re-sends to: the known engines, else the registered ones."""
        return list(self.engine_urls or self.register or [])
