"""The `suffixd` command: a click group whose subcommands load on first use.

Subcommands live in their own modules (cli/serve.py, cli/warm.py, ...) so that
`suffixd --help` stays fast and one command's imports (llama.cpp, gRPC) do not
slow down another.
"""

from __future__ import annotations

import importlib

import click

# command name -> "module:attribute" (relative to the suffixd.cli package)
_COMMANDS: dict[str, str] = {
    "serve": "serve:serve",
    "sessions": "sessions:sessions",
    "namespaces": "namespaces:namespaces",
    "generate": "generate:generate",
    "warm": "warm:warm",
    "stats": "stats:stats",
    "bench": "bench:bench",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        full_name = f"suffixd.cli.{module_name}"
        try:
            module = importlib.import_module(full_name)
        except ModuleNotFoundError as exc:
            if exc.name == full_name:  # command not built into this installation
                return None
            raise
        command: click.Command = getattr(module, attr)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="suffixd")
def main() -> None:
    """suffixd: suffix-tree drafts for speculative decoding of agent workloads."""


if __name__ == "__main__":
    main()
