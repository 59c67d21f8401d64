r"""``Option``: one hyper-parameter of a registered sampler, cache or loader,
as the command line offers it. A component declares its options next to its
code; the CLI builds its flags from the registries, so a new component needs
no CLI change."""
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, Optional, Tuple


@dataclass(frozen=True)
class Option:
    r"""Args:
        name: the parameter (a key of ``sampler_args`` / ``cache_args`` /
            ``loader_args``).
        default: its value when not given (shown in the help).
        help: one line for ``--help``.
        type: parses the flag's text.
        flag: the flag (default ``--name`` with dashes).
        const: the value of the bare flag, which then takes an optional
            argument (``--smooth-features`` means ``0.95``).
        switch: the flag takes no argument and sets this value
            (``--fixed-depth`` sets ``adaptive=False``).
        deprecated: older flags that still work, with a warning.
        run_control: changes how a run executes, not what it computes (a
            resumed run may change it).
    """
    name: str
    default: Any
    help: str
    type: Callable[[str], Any] = str
    flag: Optional[str] = None
    const: Any = None
    switch: Any = None
    deprecated: Tuple[str, ...] = ()
    run_control: bool = False

    @property
    def flags(self) -> Tuple[str, ...]:
        return (self.flag or "--" + self.name.replace("_", "-"), ) + self.deprecated


def refuse_unknown(kind: str, name: str, params: Dict[str, Any],
                   takes: Collection[str]) -> None:
    r"""Raises :class:`ValueError` when :obj:`params` hold a parameter that
    component :obj:`name` (a :obj:`kind`: ``"Sampler"``, ``"Loader"``) does
    not take: never silently ignored."""
    unknown = set(params) - set(takes)
    if unknown:
        raise ValueError(f"{kind} '{name}' takes no parameter(s) {sorted(unknown)} "
                         f"(it takes {sorted(takes) or 'none'})")
