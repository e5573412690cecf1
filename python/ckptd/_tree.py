# SPDX-License-Identifier: MIT
"""Flattening nested state into dotted names (documented in the README,
"PyTorch: what a state may hold").

Rules:
  - a dict key becomes a name component: a str as it is, an int (optimizer
    state uses them) as its decimal digits; other key types are refused;
  - a list or tuple index becomes a component (0, 1, ...);
  - components are joined with '.': {"model": {"w": t}} -> "model.w";
  - bytes outside printable ASCII, and '%', are written %XX (UTF-8), so any
    str key has a name;
  - an object with state_dict() and load_state_dict() (DCP's Stateful: a
    Module, an Optimizer, a StatefulDataLoader) contributes its state_dict()
    under its own name;
  - a name starting with "__" (reserved by the format) starts "%5F_";
  - two paths that give one name ({"a.b": x} beside {"a": {"b": y}}, or the
    keys 1 and "1") are refused before anything is sent, as is a top-level
    key starting with "~ckptd" (reserved) and a name longer than 512.
"""
import collections.abc

RESERVED = "~ckptd"
MAX_NAME = 512


def _escape(s):
    # For ASCII, isprintable() is exactly 0x20..0x7e: the common case costs
    # two C calls, not a loop over the characters.
    if s.isascii() and s.isprintable() and "%" not in s:
        return s
    out = []
    for c in s:
        if 0x20 <= ord(c) <= 0x7e and c != "%":
            out.append(c)
        else:
            out.extend("%%%02X" % b for b in c.encode("utf-8", "surrogatepass"))
    return "".join(out)


def component(key):
    if isinstance(key, bool):
        raise TypeError("a state key may be a str or an int, not a bool (%r)" % (key,))
    if isinstance(key, int):
        return str(key)
    if isinstance(key, str):
        return _escape(key)
    raise TypeError("a state key may be a str or an int, not %s (%r)"
                    % (type(key).__name__, key))


def is_stateful(v):
    return (not isinstance(v, (dict, list, tuple, type)) and
            callable(getattr(v, "state_dict", None)) and
            callable(getattr(v, "load_state_dict", None)))


class Leaf:
    """A value at a place in the state: parent[key] is it (for a value in a
    tuple, parent is the list the tuple is rebuilt from on load)."""
    __slots__ = ("name", "value", "parent", "key")

    def __init__(self, name, value, parent, key):
        self.name = name
        self.value = value
        self.parent = parent
        self.key = key


def flatten(state, is_leaf, before_stateful=None):
    """Walks `state` (a dict) and returns (leaves, statefuls, tuples):
    leaves in walk order; statefuls as (obj, its state dict) innermost
    first; tuples as (parent, key, list) whose list replaces the tuple on
    load.  is_leaf(v) says whether v is a value the caller handles (a
    tensor) rather than a container; before_stateful(obj), if given, is
    called before a Stateful's state_dict() (a load uses it to give a fresh
    optimizer the state it is to receive).  statefuls are (obj, state dict,
    name)."""
    if not isinstance(state, collections.abc.Mapping):
        raise TypeError("the state to save or load must be a dict (a state_dict), not %s"
                        % type(state).__name__)
    leaves = []
    statefuls = []
    tuples = []
    seen = {}

    def walk(v, name, parent, key, path):
        if is_leaf(v):
            add(v, name, parent, key, path)
        elif isinstance(v, collections.abc.Mapping):
            for k, sub in v.items():
                c = component(k)
                if not name and c.startswith(RESERVED):
                    raise ValueError("state key %r: names starting with %s are reserved for "
                                     "ckptd" % (k, RESERVED))
                walk(sub, name + "." + c if name else c, v, k, path + (k,))
        elif isinstance(v, (list, tuple)):
            holder = v
            if isinstance(v, tuple):
                holder = list(v)
                tuples.append((parent, key, holder, type(v)))
            for i, sub in enumerate(holder):
                walk(sub, name + "." + str(i) if name else str(i), holder, i, path + (i,))
        elif is_stateful(v):
            if before_stateful is not None:
                before_stateful(v)
            sd = v.state_dict()
            if not isinstance(sd, collections.abc.Mapping):
                raise TypeError("%s.state_dict() of %r returned %s, not a dict"
                                % (type(v).__name__, name, type(sd).__name__))
            walk(sd, name, None, None, path)
            statefuls.append((v, sd, name))
        else:
            add(v, name, parent, key, path)

    def add(v, name, parent, key, path):
        if not name:
            raise ValueError("an empty key at %r gives no name" % (path,))
        if name.startswith("__"):
            name = "%5F" + name[1:]
        if name in seen:
            raise ValueError("state paths %r and %r both flatten to the name '%s': rename one "
                             "key" % (seen[name], path, name))
        if len(name) > MAX_NAME:
            raise ValueError("state path %r flattens to a name of %d characters (at most %d)"
                             % (path, len(name), MAX_NAME))
        seen[name] = path
        leaves.append(Leaf(name, v, parent, key))

    walk(state, "", None, None, ())
    return leaves, statefuls, tuples


class _Unusual(Exception):
    """The fast walk met something only flatten() handles."""


_PLAIN = (int, float, str, bool, bytes, type(None))


def names_values(state, is_leaf):
    """The (names, values) of flatten(state, is_leaf)'s leaves, in its
    order, for a save (which needs neither Leaf objects nor statefuls).
    States of nested dicts with plain str keys (what model and optimizer
    state dicts are) are walked here at a fraction of the cost; anything
    else (lists, tuples, Stateful objects, other keys or values, a key that
    needs escaping, a reserved or duplicate name) goes through flatten()
    itself, so the rules and the errors stay its own."""
    names, values = [], []
    seen = set()

    def walk(d, prefix):
        for k, v in d.items():
            if type(k) is not str or not (k.isascii() and k.isprintable()) or "%" in k:
                raise _Unusual
            name = prefix + k
            if is_leaf(v) or type(v) in _PLAIN:
                if (not name or name in seen or name.startswith("__") or len(name) > MAX_NAME):
                    raise _Unusual
                seen.add(name)
                names.append(name)
                values.append(v)
            elif isinstance(v, dict):
                walk(v, name + ".")
            else:
                raise _Unusual

    try:
        if not isinstance(state, dict) or any(type(k) is str and k.startswith(RESERVED) for k in state):
            raise _Unusual
        walk(state, "")
    except _Unusual:
        leaves, _, _ = flatten(state, is_leaf)
        return [leaf.name for leaf in leaves], [leaf.value for leaf in leaves]
    return names, values


def assign(leaf, value):
    leaf.parent[leaf.key] = value


def rebuild_tuples(tuples):
    # Innermost first (they were appended outermost first).
    for parent, key, holder, typ in reversed(tuples):
        if parent is None:
            continue
        try:
            parent[key] = typ(holder) if typ is tuple else typ(*holder)
        except TypeError:
            parent[key] = tuple(holder)
