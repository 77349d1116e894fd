#!/usr/bin/env python3
"""Record, once per pin change, the command-line options of upstreams that cannot run here (no GPU).

  slime: run in an environment with CPU torch, slime's pure-Python dependencies, sglang==SGLANG_VERSION (installed
         without dependencies, with the transformers release its metadata pins) and sglang-router, with checkouts
         of slime at SLIME_COMMIT and Megatron-LM at the commit slime's docker/Dockerfile pins on PYTHONPATH
         (packages that load CUDA kernels at import, such as sgl-flash-mla, must be absent):
         PYTHONPATH=SLIME:MEGATRON python scripts/tools/record_upstream_flags.py slime > configs/upstream/slime-flags.json
  ray:   run in an environment with ray[default]==RAY_VERSION installed:
         python scripts/tools/record_upstream_flags.py ray > configs/upstream/ray-flags.json

The options come from the upstreams' own parsers (argparse actions, click params), not from reading text.
slime parses in two phases (slime/utils/arguments.py, parse_args): its --sglang-*/--router-* options with
sglang_parse_args(), then Megatron-LM's parser with slime's extra-args provider; both are recorded.
"""

import argparse
import datetime
import inspect
import json
import re
import sys


def argparse_arity(action: argparse.Action) -> str:
    if isinstance(
        action,
        (
            argparse._StoreTrueAction,
            argparse._StoreFalseAction,
            argparse._StoreConstAction,
            argparse._CountAction,
            argparse._HelpAction,
            argparse._VersionAction,
        ),
    ):
        return "none"
    nargs = action.nargs
    if nargs is None or nargs == 1:
        return "one"
    return {"?": "optional", "+": "one_or_more", "*": "any"}.get(nargs, f"exactly_{nargs}")


def record_slime() -> dict:
    import megatron.training.arguments as megatron_args
    import slime.utils.arguments as slime_args
    from slime.backends.sglang_utils.arguments import add_sglang_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False, conflict_handler="resolve")
    parser = megatron_args.add_megatron_arguments(parser)
    parser = slime_args.get_slime_extra_args_provider(None)(parser) or parser
    sglang_phase = add_sglang_arguments(argparse.ArgumentParser(allow_abbrev=False))
    flags = {}
    for source in (parser, sglang_phase):
        flags.update(
            {
                opt: argparse_arity(a)
                for a in source._actions
                for opt in a.option_strings
                if opt.startswith("--") and opt != "--help"
            }
        )
    for opt in re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', inspect.getsource(slime_args._pre_parse_mode)):
        flags.setdefault(opt, "one")
    return {"recorded_on": datetime.date.today().isoformat(), "flags": dict(sorted(flags.items()))}


def record_ray() -> dict:
    import click
    import ray
    from ray.scripts.scripts import cli

    def options(command) -> dict:
        out = {}
        for param in command.params:
            if isinstance(param, click.Option):
                arity = (
                    "none"
                    if param.is_flag or param.count
                    else ("one" if param.nargs == 1 else f"exactly_{param.nargs}")
                )
                out.update({opt: arity for opt in param.opts + param.secondary_opts if opt.startswith("--")})
        return dict(sorted(out.items()))

    return {
        "ray_version": ray.__version__,
        "recorded_on": datetime.date.today().isoformat(),
        "commands": {
            "ray start": options(cli.commands["start"]),
            "ray job submit": options(cli.commands["job"].commands["submit"]),
        },
    }


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in ("slime", "ray"):
        sys.exit("usage: record_upstream_flags.py slime|ray")
    json.dump(record_slime() if which == "slime" else record_ray(), sys.stdout, indent=1)
    sys.stdout.write("\n")
