"""Frozen configuration objects: ``ModelConfig`` (from config.json), ``EngineConfig``,
``ServerConfig``.

CLI flags are generated from the dataclass fields (name -> ``--name-with-dashes``), so the
defaults and help texts live in exactly one place (the rationale for each default is in
docs/configuration.md). Nothing mutates a config after start-up; derived sizes are properties
or are returned by the components that compute them.
"""

from flashrec.config.engine import EngineConfig
from flashrec.config.flags import add_config_args, config_from_args, env_flag
from flashrec.config.model import ModelConfig
from flashrec.config.server import ServerConfig

__all__ = [
    "EngineConfig",
    "ModelConfig",
    "ServerConfig",
    "add_config_args",
    "config_from_args",
    "env_flag",
]
