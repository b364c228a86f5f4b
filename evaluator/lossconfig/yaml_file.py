"""A trainer's experiment config as YAML, read safely: a regular file of at most 1 MiB
(`evaluator.inputs.read_text`), PyYAML's safe loader (plain data, no Python objects; libyaml's, which
refuses collections nested past 1000 levels, where PyYAML has it), and aliases bounded: a 1 KB "billion
laughs" (anchors nesting aliases of aliases) is refused before a value is built, as is an alias inside
its own anchor. Real configs keep their anchors and merge keys (NeMo-RL's `<<: *POLICY_BASE`). A number
in exponent form without a dot or an exponent's sign (`3e-4`, `1.0e4`: strings to YAML 1.1) is a float, as
OmegaConf reads it for AReaL, verl and NeMo-RL (`omegaconf._utils.get_yaml_loader`) and as TRL's parser
converts it (argparse's `type=float` on a config default)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from evaluator.errors import UsageError
from evaluator.inputs import read_text

VALUES = 1_000_000
"""The bound on the values (scalars, lists, mappings) a config holds once its aliases are expanded: more
than 1 MiB of YAML holds without aliases; a trainer's whole experiment config holds a few thousand."""


class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML's safe loader (libyaml's where built), with OmegaConf's floats."""


Loader.add_implicit_resolver(  # OmegaConf 2.3's float pattern: YAML 1.1's, with the exponent's sign optional
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:
         [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
        |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(path: str | Path, what: str) -> object:
    """The data of the YAML file `path` (given as `what`); a `UsageError` naming the file for a file that
    is not a regular file of at most 1 MiB, not YAML, or past `VALUES` once its aliases are expanded."""
    loader = Loader(read_text(path, what))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _bounded(node, path)
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise UsageError(f"{path}: cannot read the {what} as YAML: {error}") from None
    except RecursionError:  # the pure-Python loader, on collections nested past Python's recursion limit
        raise UsageError(f"{path}: the {what} nests too deep to be a config") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise UsageError(f"{path}: cannot read the {what} as YAML: {error}") from None
    finally:
        loader.dispose()


def _bounded(root: yaml.Node, path: str | Path) -> None:
    """Count the values under `root` with every alias expanded, each node once (a depth-first walk that
    remembers each node's count), so a bomb is measured without being built."""
    count: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        children = _children(node)
        if finished:
            open_nodes.discard(id(node))
            count[id(node)] = 1 + sum(count[id(c)] for c in children)
            if count[id(node)] > VALUES:
                raise UsageError(
                    f"{path}: holds more than {VALUES:,} values once its YAML aliases are expanded "
                    f"(line {node.start_mark.line + 1}); a config holds a few thousand"
                )
        elif id(node) in open_nodes:
            raise UsageError(f"{path}: line {node.start_mark.line + 1}: a YAML alias inside its own anchor")
        elif id(node) not in count:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack += [(c, False) for c in children if id(c) not in count]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []
