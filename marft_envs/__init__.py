"""marft_envs: PettingZoo text environments for teams of LLM agents.

The AEC agent order is the Flex-POMDP dependency function D: every team has an
explicit topology (:mod:`marft_envs.topology`) that says whose actions each
agent sees and who acts next.

    >>> import marft_envs
    >>> env = marft_envs.make("arith-duo-v0")
    >>> env.reset(seed=0)
    >>> env.team.topology.dependency("reasoner", "actor")
    True
"""

from marft_envs.profiles import AgentProfile, Team
from marft_envs.registration import (
    EnvSpec,
    Error,
    NameNotFound,
    RegistryError,
    VersionNotFound,
    load_plugins,
    make,
    pprint_registry,
    register,
    registry,
    spec,
)
from marft_envs.rewards import RewardConfig
from marft_envs.spaces import UnicodeText
from marft_envs.tasks.base import DatasetTask, GradeResult, Problem, Task
from marft_envs.text_env import TextTeamEnv
from marft_envs.topology import (
    DAG,
    Chain,
    Independent,
    MultiHopRouted,
    Routed,
    Topology,
    TopologyError,
)
from marft_envs.workflow import WorkflowEnv, WorkflowTeam, make_workflow_env

__version__ = "0.1.0"

__all__ = [
    "load_plugins",
    "AgentProfile",
    "Chain",
    "DAG",
    "DatasetTask",
    "EnvSpec",
    "Error",
    "GradeResult",
    "Independent",
    "MultiHopRouted",
    "NameNotFound",
    "Problem",
    "RegistryError",
    "RewardConfig",
    "Routed",
    "Task",
    "Team",
    "TextTeamEnv",
    "Topology",
    "TopologyError",
    "UnicodeText",
    "VersionNotFound",
    "WorkflowEnv",
    "WorkflowTeam",
    "make",
    "make_workflow_env",
    "pprint_registry",
    "register",
    "registry",
    "spec",
]

# Built-in ids register on import, after the names above exist (third parties may import us
# mid-way), and after marft_envs.envs has run all its blocks (see its docstring).
from marft_envs.envs import register_builtin_envs as _register_builtin_envs  # noqa: E402

_register_builtin_envs()
