"""Read the arguments a bash launch script passes to its training program.

Megatron-LM jobs are started by scripts like ``examples/gpt3/train_gpt3_175b_distributed.sh``:
variables (``TP=8``, ``${NNODES:-1}``, ``$((GPUS*NODES))``), bash arrays
(``MODEL_ARGS=( --num-layers 96 ... )``, ``ARGS+=(...)``), line continuations, comments,
``if [[ "$DTYPE" == "fp8" ]]; then ... fi`` blocks, and finally
``torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} ...``. :func:`read_script`
evaluates that much of bash — assignments, arrays, parameter expansion with defaults,
integer arithmetic, quoting and word splitting, simple ``[[ ]]`` tests — and returns the
launcher's words and the program's words. It runs nothing: a command substitution
(``$(hostname)``) expands to nothing and is reported; other commands (``mkdir``, ``echo``,
``exit``) are skipped. Text with no ``*.py`` program is read as a plain argument list.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re

import attrs

from .errors import ConfigError

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"^({_NAME})(\+?)=(.*)$", re.S)
#: programs that start another program (their own options come before the script)
LAUNCHERS = ("torchrun", "python", "python3", "deepspeed", "srun", "mpirun", "accelerate", "uv", "env", "exec")


@attrs.frozen
class LaunchCommand:
    """The launch line of a script: the launcher's words, the program and its arguments."""

    launcher: tuple[str, ...]
    program: str
    arguments: tuple[str, ...]
    #: what could not be evaluated (command substitutions, file tests), one line each
    notes: tuple[str, ...] = ()
    #: the variables at the launch line (scalars; arrays joined by spaces)
    variables: tuple[tuple[str, str], ...] = ()


class _Shell:
    def __init__(self, environ: dict[str, str] | None = None):
        self.vars: dict[str, str | list[str]] = {}
        self.environ = dict(environ) if environ is not None else {}
        self.notes: list[str] = []

    # ------------------------------------------------------------------ values
    def get(self, name: str) -> str | list[str] | None:
        if name in self.vars:
            return self.vars[name]
        return self.environ.get(name)

    def scalar(self, name: str) -> str | None:
        v = self.get(name)
        return v[0] if isinstance(v, list) and v else (None if isinstance(v, list) else v)

    # ------------------------------------------------------------------ expansion
    def words(self, text: str) -> list[str]:
        """Expand and split `text` into words as bash would (no globbing)."""
        words: list[str] = []
        cur: list[str] = []
        has = False  # the current word exists (an empty "" counts)
        i, n = 0, len(text)

        def flush():
            nonlocal cur, has
            if has:
                words.append("".join(cur))
            cur, has = [], False

        def add_split(value: str | list[str]):
            nonlocal has
            parts = value if isinstance(value, list) else [value]
            fields = [f for part in parts for f in part.split()]
            if not fields:
                return
            leading = bool(parts) and (parts[0][:1].isspace() if parts[0] else False)
            if leading:
                flush()
            for j, f in enumerate(fields):
                if j:
                    flush()
                cur.append(f)
                has = True
            trailing = parts[-1][-1:].isspace() if parts[-1] else False
            if trailing:
                flush()

        while i < n:
            ch = text[i]
            if ch.isspace():
                flush()
                i += 1
            elif ch == "'":
                j = text.find("'", i + 1)
                j = n if j < 0 else j
                cur.append(text[i + 1:j])
                has = True
                i = j + 1
            elif ch == '"':
                i, pieces = self._double_quoted(text, i + 1)
                for k, piece in enumerate(pieces):
                    if k:
                        flush()
                    cur.append(piece)
                    has = True
            elif ch == "\\":
                if i + 1 < n:
                    cur.append(text[i + 1])
                    has = True
                i += 2
            elif ch == "$" or ch == "`":
                i, value = self._dollar(text, i)
                add_split(value)
            else:
                cur.append(ch)
                has = True
                i += 1
        flush()
        return words

    def _double_quoted(self, text: str, i: int) -> tuple[int, list[str]]:
        """Expand a "..." body from `i`; "${A[@]}" yields one piece per element."""
        pieces: list[str] = [""]
        n = len(text)
        while i < n and text[i] != '"':
            ch = text[i]
            if ch == "\\" and i + 1 < n and text[i + 1] in '"\\$`':
                pieces[-1] += text[i + 1]
                i += 2
            elif ch in "$`":
                i, value = self._dollar(text, i)
                if isinstance(value, list):
                    if value:
                        pieces[-1] += value[0]
                        pieces.extend(value[1:])
                else:
                    pieces[-1] += value
            else:
                pieces[-1] += ch
                i += 1
        return i + 1, pieces

    def _dollar(self, text: str, i: int) -> tuple[int, str | list[str]]:
        """Expand the `$...` (or backtick) expression at `i`; return (end, value)."""
        if text[i] == "`":
            j = text.find("`", i + 1)
            j = len(text) if j < 0 else j
            self.notes.append(f"command substitution `{text[i + 1:j]}` not run (expanded to nothing)")
            return j + 1, ""
        if text.startswith("$((", i):
            j = _matching(text, i + 1, "(", ")")
            expr = text[i + 3:j - 1]
            return j + 1, self._arith(expr)
        if text.startswith("$(", i):
            j = _matching(text, i + 1, "(", ")")
            self.notes.append(f"command substitution $({text[i + 2:j]}) not run (expanded to nothing)")
            return j + 1, ""
        if text.startswith("${", i):
            j = _matching(text, i + 1, "{", "}")
            return j + 1, self._brace(text[i + 2:j])
        m = re.compile(rf"{_NAME}|[0-9@*#?$!]").match(text, i + 1)
        if not m:
            return i + 1, "$"
        name = m.group(0)
        value = self.get(name) if not name.isdigit() else None
        if isinstance(value, list):
            value = value[0] if value else ""
        return m.end(), value or ""

    def _brace(self, body: str) -> str | list[str]:
        m = re.match(rf"^(#?)({_NAME}|[0-9]+)(\[([@*]|[0-9]+)\])?(.*)$", body, re.S)
        if not m:
            self.notes.append(f"${{{body}}} not understood (expanded to nothing)")
            return ""
        length, name, _, index, rest = m.groups()
        value = self.get(name) if not name.isdigit() else None
        if index in ("@", "*"):
            elems = value if isinstance(value, list) else ([value] if value else [])
            return str(len(elems)) if length else list(elems)
        if isinstance(value, list):
            value = value[int(index)] if index is not None and int(index) < len(value) else (
                value[0] if value and index is None else None)
        if length:
            return str(len(value or ""))
        for op in (":-", ":=", ":+", "-", "=", "+"):
            if rest.startswith(op):
                word = " ".join(self.words(rest[len(op):])) if rest[len(op):] else ""
                unset = value is None or (op.startswith(":") and value == "")
                if op.endswith("+"):
                    return "" if unset else word
                if unset and op.endswith("="):
                    self.vars[name] = word
                return word if unset else value
        if rest:
            self.notes.append(f"${{{body}}}: the expansion {rest!r} is not supported (used the plain value)")
        return value or ""

    def _arith(self, expr: str) -> str:
        def var(match):
            return self.scalar(match.group(1) or match.group(2)) or "0"
        text = re.sub(rf"\$\{{?({_NAME})\}}?|\b({_NAME})\b", var, expr)
        try:
            return str(_eval_int(ast.parse(text.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
            self.notes.append(f"arithmetic $(({expr})) not understood (expanded to nothing)")
            return ""

    # ------------------------------------------------------------------ tests
    def test(self, words: list[str]) -> bool | None:
        """Evaluate the words of a ``[[ ... ]]`` / ``[ ... ]`` test; None when not understood."""
        if words and words[0] in ("[[", "[", "test"):
            words = words[1:]
        if words and words[-1] in ("]]", "]"):
            words = words[:-1]
        for op, fn in (("||", any), ("&&", all)):
            if op in words:
                k = words.index(op)
                left, right = self.test(words[:k]), self.test(words[k + 1:])
                if left is None or right is None:
                    return None
                return fn([left, right])
        if words and words[0] == "!":
            inner = self.test(words[1:])
            return None if inner is None else not inner
        if len(words) == 2 and words[0] in ("-z", "-n"):
            return (words[1] == "") == (words[0] == "-z")
        if len(words) == 1:
            return words[0] != ""
        if len(words) == 3:
            a, op, b = words
            if op in ("==", "="):
                return fnmatch.fnmatchcase(a, b)
            if op == "!=":
                return not fnmatch.fnmatchcase(a, b)
            num = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le,
                   "-gt": operator.gt, "-ge": operator.ge}
            if op in num:
                try:
                    return num[op](int(a), int(b))
                except ValueError:
                    return None
        return None


def _matching(text: str, i: int, open_: str, close: str) -> int:
    """Index of the `close` matching the `open_` at `i` (quotes respected)."""
    depth = 0
    quote = None
    for j in range(i, len(text)):
        ch = text[j]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == open_:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _eval_int(node) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_int(node.left), _eval_int(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        x = _eval_int(node.operand)
        return -x if isinstance(node.op, ast.USub) else x
    raise ValueError("not integer arithmetic")


# ---------------------------------------------------------------------- statements


def _strip_comment(line: str) -> str:
    """`line` without a trailing ``# comment`` (a ``#`` that starts a word, outside quotes)."""
    quote = None
    for j, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (j == 0 or line[j - 1].isspace()):
            return line[:j]
    return line


def _statements(text: str) -> list[str]:
    """Logical statements: continuations joined, comments dropped, arrays gathered, ``;`` split."""
    text = re.sub(r"\\\r?\n", " ", text)
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = _strip_comment(raw).strip()
        if not line and not pending:
            continue
        pending = f"{pending}\n{line}" if pending else line
        if _open_quote(pending):
            continue  # a quoted string continues on the next line
        if pending.count("(") > pending.count(")") and re.search(rf"{_NAME}\+?=\(", pending):
            continue  # an array definition continues on the next line
        out.extend(s.strip() for s in _split_semicolons(pending) if s.strip())
        pending = ""
    if pending:
        out.extend(s.strip() for s in _split_semicolons(pending) if s.strip())
    return out


def _open_quote(text: str) -> bool:
    quote = None
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
    return quote is not None


def _split_semicolons(line: str) -> list[str]:
    parts, cur, quote, depth = [], [], None, 0
    for ch in line:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == ";" and depth <= 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def read_script(text: str, environ: dict[str, str] | None = None) -> LaunchCommand:
    """The launch command of a bash script (or the words of a bare argument list).

    `environ` gives variables the script reads from its environment (default: none, so that
    ``${NNODES:-1}`` takes its default, as a fresh shell on one node would).
    """
    sh = _Shell(environ)
    launch: LaunchCommand | None = None
    active = [True]  # one entry per open if; whether its current branch runs
    taken = [True]  # whether some branch of each open if already ran
    for stmt in _statements(text):
        head = stmt.split(None, 1)[0]
        if head in ("if", "elif"):
            cond = re.sub(r"^(if|elif)\s+", "", stmt)
            cond = re.sub(r"\s*;?\s*then\s*$", "", cond)
            cond = re.sub(r"\s+then\s*$", "", cond)
            value = sh.test(sh.words(cond)) if all(active[:-1] if head == "elif" else active) else False
            if value is None:
                sh.notes.append(f"could not evaluate `{cond}`; took it as false")
                value = False
            if head == "if":
                active.append(bool(value))
                taken.append(bool(value))
            else:
                active[-1] = bool(value) and not taken[-1]
                taken[-1] = taken[-1] or bool(value)
            continue
        if head == "else":
            active[-1] = not taken[-1]
            taken[-1] = True
        if head in ("then", "do", "else"):
            stmt = stmt[len(head):].strip()
            if not stmt:
                continue
            head = stmt.split(None, 1)[0]
        if stmt in ("done", "{", "}"):
            continue
        if head == "fi":
            if len(active) > 1:
                active.pop()
                taken.pop()
            continue
        if not all(active):
            continue
        if head in ("export", "local", "declare", "readonly", "typeset"):
            stmt = re.sub(r"^\S+(\s+-[A-Za-z]+)*\s*", "", stmt)
            if not stmt:
                continue
        m = _ASSIGN.match(stmt)
        if m and (m.group(3).startswith("(") or not _has_command(stmt)):
            _assign(sh, m)
            continue
        words, prefix = _command_words(sh, stmt)
        words = _simple_command(words)
        inner = next((w for w in words if re.search(r"\s", w) and re.search(r"\.py(\s|$)", w)), None)
        if inner is not None and not any(w.endswith(".py") for w in words):  # bash -c "cd x; torchrun ... x.py"
            found = read_script(inner.replace(";", "\n"), environ={**sh.environ, **_str_vars(sh.vars)})
            if found.program:  # srun ... bash -c "...": the outer launcher's words come first
                outer = tuple(w for w in words[:words.index(inner)] if w not in ("bash", "sh", "-c"))
                launch = attrs.evolve(found, launcher=(*outer, *found.launcher), notes=(*sh.notes, *found.notes))
            continue
        prog = next((k for k, w in enumerate(words) if w.endswith(".py")), None)
        if prog is not None and (launch is None or _is_training(words[prog]) or not _is_training(launch.program)):
            launch = LaunchCommand(launcher=tuple(words[:prog]), program=words[prog],
                                   arguments=tuple(words[prog + 1:]), notes=tuple(sh.notes),
                                   variables=tuple(_flat_vars({**sh.environ, **prefix, **sh.vars})))
    if launch is None:  # a command kept in a variable (TRAINING_CMD="... python pretrain_gpt.py ...")
        for name, value in sh.vars.items():
            if isinstance(value, str) and re.search(r"\.py(\s|$)", value):
                inner = read_script(value.replace(";", "\n"), environ={**sh.environ, **_str_vars(sh.vars)})
                if inner.program:
                    launch = attrs.evolve(inner, notes=(*sh.notes, f"the command in ${name} was read",
                                                        *inner.notes))
    if launch is None:
        words = [w for s in _statements(text) for w in sh.words(s)]
        first = next((k for k, w in enumerate(words) if w.startswith("-")), len(words))
        if not words or first == len(words):
            raise ConfigError("no arguments found: give a launch script whose command runs a *.py program, "
                              "or an argument list such as '--tensor-model-parallel-size 8 --num-layers 32 ...'")
        launch = LaunchCommand(launcher=(), program="", arguments=tuple(words[first:]), notes=tuple(sh.notes),
                               variables=tuple(_flat_vars({**sh.environ, **sh.vars})))
    return launch


def _is_training(program: str) -> bool:
    """A training entry point (``pretrain_gpt.py``, ``train.py``): preferred over other programs
    a script runs (data preprocessing, checkpoint conversion), whichever comes last."""
    return bool(re.search(r"(^|/)(pre)?train[^/]*\.py$", program))


def _simple_command(words: list[str]) -> list[str]:
    """`words` up to a pipe or list operator, without redirections (``> log``, ``2>&1``)."""
    out: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("|", "||", "&&", "&", "|&"):
            break
        if re.match(r"^\d*(>>?|<)(&\d+)?$", w):
            skip = not w.endswith(tuple("0123456789"))  # "> file": the file is the next word
            continue
        if re.match(r"^\d*(>>?|<)&?\S+$", w):
            continue
        out.append(w)
    return out


def _has_command(stmt: str) -> bool:
    """Whether `stmt` (starting with NAME=value) runs a command after its assignments."""
    rest = stmt
    while True:
        m = _ASSIGN.match(rest)
        if not m:
            return bool(rest.strip())
        value = m.group(3)
        j = _word_end(value)
        rest = value[j:].lstrip()
        if not rest:
            return False


def _word_end(text: str) -> int:
    """End of the first word of `text`: whitespace outside quotes, ``$(...)`` and ``${...}``."""
    quote = None
    depth = 0
    for j, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "({" and (depth or text[j - 1:j] in ("$", "(")):
            depth += 1
        elif ch in ")}" and depth:
            depth -= 1
        elif ch.isspace() and not depth:
            return j
    return len(text)


def _assign(sh: _Shell, m) -> None:
    name, append, value = m.groups()
    value = value.strip()
    if value.startswith("("):
        body = value[1:value.rfind(")")] if ")" in value else value[1:]
        elems = sh.words(body)
        old = sh.get(name) if append else []
        old = old if isinstance(old, list) else ([old] if old else [])
        sh.vars[name] = [*old, *elems]
        return
    j = _word_end(value)
    words = sh.words(value[:j])
    new = " ".join(words) if words else ""
    if append:
        old = sh.get(name)
        if isinstance(old, list):
            sh.vars[name] = [*old, new]
            return
        new = (old or "") + new
    sh.vars[name] = new


def _command_words(sh: _Shell, stmt: str) -> tuple[list[str], dict[str, str]]:
    """The words of a command, after its ``NAME=value`` prefixes (returned separately)."""
    prefix: dict[str, str] = {}
    rest = stmt
    while True:
        m = _ASSIGN.match(rest)
        if not m or m.group(3).startswith("("):
            break
        j = _word_end(m.group(3))
        prefix[m.group(1)] = " ".join(sh.words(m.group(3)[:j]))
        rest = m.group(3)[j:].lstrip()
    return sh.words(rest), prefix


def _str_vars(d: dict) -> dict[str, str]:
    return {k: v for k, v in d.items() if isinstance(v, str)}


def _flat_vars(d: dict) -> list[tuple[str, str]]:
    return sorted((k, " ".join(v) if isinstance(v, list) else str(v)) for k, v in d.items())


def _options(words: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    for k, w in enumerate(words):
        if w.startswith("-"):
            key, eq, val = w.lstrip("-").partition("=")
            key = key.replace("-", "_")
            if eq:
                opts[key] = val
            elif k + 1 < len(words) and not words[k + 1].startswith("-"):
                opts[key] = words[k + 1]
    return opts


def launcher_gpus(launch: LaunchCommand) -> int | None:
    """GPUs the launch line starts, if it says: torchrun's (or ``torch.distributed.run``'s)
    processes per node × nodes, else srun's tasks per node × nodes (one task per GPU)."""
    words = list(launch.launcher)
    torch_at = next((k for k, w in enumerate(words) if w in ("torchrun", "torch.distributed.run",
                                                                "torch.distributed.launch")), None)
    if torch_at is not None:
        opts = _options(words[torch_at + 1:])
        nproc, nnodes = opts.get("nproc_per_node"), opts.get("nnodes", "1").split(":")[-1]  # elastic MIN:MAX
    elif "srun" in words:
        opts = _options(words[words.index("srun") + 1:])
        nproc, nnodes = opts.get("ntasks_per_node"), opts.get("nodes", opts.get("N", "1"))
    else:
        return None
    if nproc is None or not nproc.isdigit() or not nnodes.isdigit():
        return None
    return int(nproc) * int(nnodes)
