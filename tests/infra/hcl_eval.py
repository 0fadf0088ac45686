"""Evaluate the expressions of this repository's Terraform in Python.

`terraform validate` and `plan` need the google provider, which cannot be
downloaded on the build machines, so nothing would otherwise run the
variable validation rules before an instructor does. This module parses the
``.tf`` files with python-hcl2 (its raw parse tree keeps every expression)
and evaluates the subset of the HCL expression language that the
configuration uses: literals, strings with interpolation, tuples and
objects, ``var.*`` and ``local.*`` references, attribute and index access,
``for`` expressions over tuples, the conditional and the arithmetic,
comparison and logical operators, and the functions listed in
``Evaluator.FUNCTIONS``.

Anything outside that subset raises :class:`UnsupportedExpression`, so a new
construct in ``terraform/`` makes the tests fail loudly until this evaluator
learns it, instead of being skipped. Where a ``terraform`` binary exists,
tests/infra/test_terraform.py also runs the same validation cases through
Terraform itself and checks that both agree.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
from hcl2.utils import process_escape_sequences
from lark import Token, Tree


class HclEvalError(Exception):
    """An expression failed the way Terraform would fail it (bad argument, missing key)."""


class UnsupportedExpression(Exception):
    """The expression uses HCL this evaluator does not implement."""


@dataclass
class Block:
    """One block of a ``.tf`` file: its type, labels, attributes and nested blocks."""

    type: str
    labels: tuple[str, ...]
    attributes: dict[str, Tree]
    blocks: list[Block]
    path: Path

    def nested(self, block_type: str) -> list[Block]:
        """The nested blocks of one type, in file order."""
        return [b for b in self.blocks if b.type == block_type]


def _trees(node: Tree) -> list[Tree]:
    """Children that are subtrees, without the comment and newline nodes."""
    return [c for c in node.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]


def _tokens(node: Tree) -> list[Token]:
    return [c for c in node.children if isinstance(c, Token)]


def _name(node: Tree) -> str:
    """The text of an identifier, keyword or literal_value node."""
    (token,) = _tokens(node)
    return str(token)


def _literal_string(node: Tree, path: Path) -> str:
    """The value of a string with no interpolation (a block label)."""
    parts = []
    for part in _trees(node):
        (inner,) = part.children
        if not isinstance(inner, Token):
            raise UnsupportedExpression(f"{path}: interpolation in a block label")
        parts.append(process_escape_sequences(str(inner)))
    return "".join(parts)


def _parse_body(body: Tree, path: Path) -> tuple[dict[str, Tree], list[Block]]:
    attributes: dict[str, Tree] = {}
    blocks: list[Block] = []
    for child in _trees(body):
        if child.data == "attribute":
            name_node, *rest = _trees(child)
            attributes[_name(name_node)] = rest[-1]
        elif child.data == "block":
            parts = _trees(child)
            type_node, *label_nodes, inner_body = parts
            labels = tuple(_literal_string(n, path) if n.data == "string" else _name(n) for n in label_nodes)
            inner_attributes, inner_blocks = _parse_body(inner_body, path)
            blocks.append(Block(_name(type_node), labels, inner_attributes, inner_blocks, path))
        else:
            raise UnsupportedExpression(f"{path}: unexpected body element {child.data}")
    return attributes, blocks


def parse_file(path: Path) -> list[Block]:
    """All top-level blocks of one ``.tf`` file."""
    tree = hcl2.parses_to_tree(path.read_text())
    (body,) = _trees(tree)
    attributes, blocks = _parse_body(body, path)
    if attributes:
        raise UnsupportedExpression(f"{path}: top-level attributes {sorted(attributes)}")
    return blocks


def parse_tfvars(path: Path) -> dict[str, Tree]:
    """The attribute expressions of a ``.tfvars`` file, by name."""
    tree = hcl2.parses_to_tree(path.read_text())
    (body,) = _trees(tree)
    attributes, blocks = _parse_body(body, path)
    if blocks:
        raise UnsupportedExpression(f"{path}: blocks in a tfvars file")
    return attributes


@dataclass
class Module:
    """The top-level blocks of every ``.tf`` file in one directory."""

    directory: Path
    blocks: list[Block] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path, names: list[str] | None = None) -> Module:
        """Parse ``directory/*.tf`` (or only the named files)."""
        paths = [directory / n for n in names] if names else sorted(directory.glob("*.tf"))
        module = cls(directory)
        for path in paths:
            module.blocks.extend(parse_file(path))
        return module

    def of_type(self, block_type: str) -> list[Block]:
        return [b for b in self.blocks if b.type == block_type]

    def one(self, block_type: str, *labels: str) -> Block:
        """The single block with this type and labels; AssertionError otherwise."""
        found = [b for b in self.of_type(block_type) if b.labels == labels]
        assert len(found) == 1, f"expected one {block_type} {labels}, found {len(found)}"
        return found[0]

    @property
    def variables(self) -> dict[str, Block]:
        return {b.labels[0]: b for b in self.of_type("variable")}

    @property
    def local_expressions(self) -> dict[str, Tree]:
        merged: dict[str, Tree] = {}
        for block in self.of_type("locals"):
            merged.update(block.attributes)
        return merged


def _equal(a: Any, b: Any) -> bool:
    """Terraform's ==: values of different types are never equal (true != 1)."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _number(value: Any, what: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HclEvalError(f"{what}: a number is required, got {value!r}")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise HclEvalError(f"{what}: a bool is required, got {value!r}")
    return value


def _regex(pattern: str, string: str) -> Any:
    match = re.search(pattern, string)
    if match is None:
        raise HclEvalError(f"regex: pattern {pattern!r} does not match {string!r}")
    if match.re.groupindex:
        return match.groupdict()
    if match.re.groups:
        return list(match.groups())
    return match.group(0)


def _cidrhost(prefix: str, hostnum: int) -> str:
    try:
        network = ipaddress.ip_network(prefix, strict=False)
    except ValueError as err:
        raise HclEvalError(f"cidrhost: invalid CIDR {prefix!r}: {err}") from err
    if not 0 <= hostnum < network.num_addresses:
        raise HclEvalError(f"cidrhost: host {hostnum} outside {prefix}")
    return str(network.network_address + hostnum)


def _lookup(mapping: dict, key: str, *default: Any) -> Any:
    if not isinstance(mapping, dict):
        raise HclEvalError(f"lookup: a map is required, got {mapping!r}")
    if key in mapping:
        return mapping[key]
    if default:
        return default[0]
    raise HclEvalError(f"lookup: key {key!r} not found")


class Evaluator:
    """Evaluates expressions with given variable values and the module's locals."""

    FUNCTIONS: dict[str, Callable[..., Any]] = {
        "alltrue": lambda items: all(_bool(i, "alltrue") for i in items),
        "anytrue": lambda items: any(_bool(i, "anytrue") for i in items),
        "cidrhost": _cidrhost,
        "contains": lambda items, value: any(_equal(i, value) for i in items),
        "endswith": lambda s, suffix: s.endswith(suffix),
        "floor": lambda x: math.floor(_number(x, "floor")),
        "keys": lambda mapping: sorted(mapping),
        "length": len,
        "lookup": _lookup,
        "lower": str.lower,
        "regex": _regex,
        "startswith": lambda s, prefix: s.startswith(prefix),
        "toset": lambda items: sorted(set(items)),
        "upper": str.upper,
    }

    def __init__(self, variables: dict[str, Any], local_expressions: dict[str, Tree]):
        self.variables = variables
        self.local_expressions = local_expressions
        self._locals: dict[str, Any] = {}
        self._evaluating: set[str] = set()

    # -- references --------------------------------------------------------

    def local(self, name: str) -> Any:
        if name not in self.local_expressions:
            raise HclEvalError(f"local.{name} is not defined")
        if name not in self._locals:
            if name in self._evaluating:
                raise HclEvalError(f"local.{name} refers to itself")
            self._evaluating.add(name)
            try:
                self._locals[name] = self.eval(self.local_expressions[name])
            finally:
                self._evaluating.discard(name)
        return self._locals[name]

    def variable(self, name: str) -> Any:
        if name not in self.variables:
            raise HclEvalError(f"var.{name} is not defined")
        return self.variables[name]

    # -- expressions -------------------------------------------------------

    def eval(self, node: Tree, scope: dict[str, Any] | None = None) -> Any:
        scope = scope or {}
        handler = getattr(self, f"_eval_{node.data}", None)
        if handler is None:
            raise UnsupportedExpression(
                f"HCL construct {node.data!r} (line {node.meta.line if not node.meta.empty else '?'})"
            )
        return handler(node, scope)

    def _eval_expr_term(self, node: Tree, scope: dict) -> Any:
        (inner,) = _trees(node)
        return self.eval(inner, scope)

    def _eval_int_lit(self, node: Tree, scope: dict) -> int:
        return int(_tokens(node)[0])

    def _eval_float_lit(self, node: Tree, scope: dict) -> float:
        return float(_tokens(node)[0])

    def _eval_literal_value(self, node: Tree, scope: dict) -> Any:
        return {"true": True, "false": False, "null": None}[_name(node)]

    def _eval_string(self, node: Tree, scope: dict) -> str:
        pieces = []
        for part in _trees(node):
            (inner,) = part.children
            if isinstance(inner, Token):
                text = str(inner)
                if inner.type == "ESCAPED_INTERPOLATION":
                    text = text[1:]  # $${ is a literal ${
                pieces.append(process_escape_sequences(text))
            elif inner.data == "interpolation":
                (expression,) = _trees(inner)
                value = self.eval(expression, scope)
                if isinstance(value, bool):
                    value = "true" if value else "false"
                elif isinstance(value, float) and value.is_integer():
                    value = int(value)
                if isinstance(value, (list, dict)) or value is None:
                    raise HclEvalError(f"cannot interpolate {value!r} into a string")
                pieces.append(str(value))
            else:
                raise UnsupportedExpression(f"template directive {inner.data}")
        return "".join(pieces)

    def _eval_tuple(self, node: Tree, scope: dict) -> list:
        return [self.eval(item, scope) for item in _trees(node)]

    def _eval_object(self, node: Tree, scope: dict) -> dict:
        result = {}
        for element in _trees(node):
            key_node, value_node = _trees(element)
            (key_expression,) = _trees(key_node)
            (key_inner,) = _trees(key_expression) if key_expression.data == "expr_term" else (key_expression,)
            # A bare word is the key itself; anything else is an expression.
            key = _name(key_inner) if key_inner.data == "identifier" else self.eval(key_expression, scope)
            result[key] = self.eval(value_node, scope)
        return result

    def _eval_identifier(self, node: Tree, scope: dict) -> Any:
        name = _name(node)
        if name in scope:
            return scope[name]
        raise HclEvalError(f"unknown name {name!r}")

    def _eval_get_attr_expr_term(self, node: Tree, scope: dict) -> Any:
        base, get_attr = _trees(node)
        (attr_node,) = _trees(get_attr)
        attr = _name(attr_node)
        base_inner = _trees(base)[0] if base.data == "expr_term" else base
        if base_inner.data == "identifier" and _name(base_inner) not in scope:
            namespace = _name(base_inner)
            if namespace == "var":
                return self.variable(attr)
            if namespace == "local":
                return self.local(attr)
            raise UnsupportedExpression(
                f"reference {namespace}.{attr} (only var.* and local.* can be evaluated offline)"
            )
        value = self.eval(base, scope)
        if not isinstance(value, dict) or attr not in value:
            raise HclEvalError(f"no attribute {attr!r} in {value!r}")
        return value[attr]

    def _eval_index_expr_term(self, node: Tree, scope: dict) -> Any:
        base, index = _trees(node)
        value = self.eval(base, scope)
        if index.data == "braces_index":
            (key_node,) = _trees(index)
            key = self.eval(key_node, scope)
        else:
            key = int([t for t in _tokens(index) if t.type == "INT_LITERAL"][0])
        try:
            return value[key]
        except (KeyError, IndexError, TypeError) as err:
            raise HclEvalError(f"index {key!r} not in {value!r}") from err

    def _eval_function_call(self, node: Tree, scope: dict) -> Any:
        name_node, *rest = _trees(node)
        name = _name(name_node)
        argument_nodes = _trees(rest[0]) if rest else []
        if name == "can":
            (argument,) = argument_nodes
            try:
                self.eval(argument, scope)
            except HclEvalError:
                return False
            return True
        if name not in self.FUNCTIONS:
            raise UnsupportedExpression(f"function {name}()")
        arguments = [self.eval(a, scope) for a in argument_nodes]
        try:
            return self.FUNCTIONS[name](*arguments)
        except HclEvalError:
            raise
        except (TypeError, ValueError, AttributeError) as err:
            raise HclEvalError(f"{name}{tuple(arguments)!r}: {err}") from err

    def _eval_conditional(self, node: Tree, scope: dict) -> Any:
        condition, if_true, if_false = _trees(node)
        if _bool(self.eval(condition, scope), "condition of ? :"):
            return self.eval(if_true, scope)
        return self.eval(if_false, scope)

    def _eval_unary_op(self, node: Tree, scope: dict) -> Any:
        (operator,) = _tokens(node)
        (operand,) = _trees(node)
        value = self.eval(operand, scope)
        if operator == "!":
            return not _bool(value, "!")
        return -_number(value, "unary -")

    def _eval_binary_op(self, node: Tree, scope: dict) -> Any:
        left_node, term = _trees(node)
        operator_node, right_node = _trees(term)
        operator = str(_tokens(operator_node)[0])
        left = self.eval(left_node, scope)
        if operator in ("&&", "||"):
            # Terraform evaluates both sides; so does this (errors surface).
            right = self.eval(right_node, scope)
            a, b = _bool(left, operator), _bool(right, operator)
            return (a and b) if operator == "&&" else (a or b)
        right = self.eval(right_node, scope)
        if operator == "==":
            return _equal(left, right)
        if operator == "!=":
            return not _equal(left, right)
        a, b = _number(left, operator), _number(right, operator)
        if operator == "<":
            return a < b
        if operator == ">":
            return a > b
        if operator == "<=":
            return a <= b
        if operator == ">=":
            return a >= b
        if operator == "+":
            return a + b
        if operator == "-":
            return a - b
        if operator == "*":
            return a * b
        if operator == "/":
            if b == 0:
                raise HclEvalError("division by zero")
            return a / b
        if operator == "%":
            return a % b
        raise UnsupportedExpression(f"operator {operator}")

    def _eval_for_tuple_expr(self, node: Tree, scope: dict) -> list:
        intro, *parts = _trees(node)
        names = [_name(n) for n in _trees(intro) if n.data == "identifier"]
        (collection_node,) = [n for n in _trees(intro) if n.data != "identifier"]
        collection = self.eval(collection_node, scope)
        value_node = parts[0]
        condition_node = _trees(parts[1])[0] if len(parts) > 1 else None
        if isinstance(collection, dict):
            pairs = list(collection.items())
        elif isinstance(collection, list):
            pairs = list(enumerate(collection))
        else:
            raise HclEvalError(f"for: cannot iterate over {collection!r}")
        result = []
        for key, value in pairs:
            inner = dict(scope)
            if len(names) == 2:
                inner[names[0]], inner[names[1]] = key, value
            else:
                inner[names[0]] = value
            if condition_node is not None and not _bool(self.eval(condition_node, inner), "for ... if"):
                continue
            result.append(self.eval(value_node, inner))
        return result


def variable_values(module: Module, overrides: dict[str, Any]) -> dict[str, Any]:
    """Every variable's value: the override if given, else its evaluated default.

    Raises KeyError naming a required variable (no default) left unset.
    """
    constants = Evaluator({}, {})
    values = {}
    for name, block in module.variables.items():
        if name in overrides:
            values[name] = overrides[name]
        elif "default" in block.attributes:
            values[name] = constants.eval(block.attributes["default"])
        else:
            raise KeyError(f"variable {name!r} is required and was not given")
    unknown = set(overrides) - set(values)
    if unknown:
        raise KeyError(f"no such variables: {sorted(unknown)}")
    return values


def validation_failures(module: Module, overrides: dict[str, Any]) -> dict[str, list[str]]:
    """The error messages of every failing validation rule, by variable name.

    Evaluates each ``validation { condition, error_message }`` with the
    variables set to ``overrides`` over their defaults, as ``terraform plan``
    would before touching any provider. An empty dict means all rules pass.
    """
    evaluator = Evaluator(variable_values(module, overrides), module.local_expressions)
    failures: dict[str, list[str]] = {}
    for name, block in module.variables.items():
        for rule in block.nested("validation"):
            try:
                ok = evaluator.eval(rule.attributes["condition"])
            except HclEvalError as err:
                failures.setdefault(name, []).append(f"condition could not be evaluated: {err}")
                continue
            if not isinstance(ok, bool):
                raise HclEvalError(f"validation of {name} returned {ok!r}, not a bool")
            if not ok:
                failures.setdefault(name, []).append(evaluator.eval(rule.attributes["error_message"]))
    return failures
