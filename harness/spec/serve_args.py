"""A ``flashrec`` engine's static args as ``flashrec serve`` flags, and that command's own
parser's word on them: shared by cell expansion (a flag it rejects fails the matrix at load
time) and the server launch."""

from __future__ import annotations

from harness.spec.matrix import Scalar


def flags(args: dict[str, Scalar]) -> list[str]:
    """``{beam_width: 4, disable_cuda_graph: True, x: False}`` -> ``--beam-width 4 ...``."""
    out: list[str] = []
    for key, value in args.items():
        name = "--" + key.replace("_", "-")
        if value is None:
            continue
        if value is True:
            out.append(name)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        else:
            out += [name, str(value)]
    return out


def flashrec_serve_args(args: dict[str, Scalar]) -> dict[str, Scalar]:
    """``args`` as ``flashrec serve`` takes them. YAML 1.1 reads an unquoted ``on`` / ``off``
    as a boolean, so ``engine_process: off`` arrives as False; an option whose choices are
    ``on`` / ``off`` gets the word back (a boolean would become ``--no-engine-process``, a
    flag that option does not have)."""
    import dataclasses

    from flashrec.config import ServerConfig

    choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(ServerConfig)}
    out: dict[str, Scalar] = {}
    for key, value in args.items():
        words = choices.get(key) or ()
        if isinstance(value, bool) and {"on", "off"} <= set(words):
            value = "on" if value else "off"
        out[key] = value
    return out


def check_flashrec_args(args: dict[str, Scalar]) -> str | None:
    """What ``flashrec serve`` says about these flags before it loads anything (its own
    parser and its config checks): None when it takes them, else its message."""
    import argparse
    import contextlib
    import io

    from flashrec.config import ServerConfig, add_config_args, config_from_args

    parser = argparse.ArgumentParser(prog="flashrec serve", add_help=False, exit_on_error=False)
    add_config_args(parser, ServerConfig)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(flags(args))
        config_from_args(ServerConfig, ns)
    except SystemExit:  # argparse's own error exit (unknown flags): its last line
        lines = err.getvalue().strip().splitlines()
        last = lines[-1] if lines else "rejected by its parser"
        return last.removeprefix(f"{parser.prog}: error: ")
    except (argparse.ArgumentError, ValueError, TypeError) as exc:
        return str(exc)
    return None
