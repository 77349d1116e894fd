"""The judge side of the supervisor (an embedded program): the bounded channel to the candidate, proxies for the
solution's functions, strict comparison and the rewriting of every assert into a counted check."""

from __future__ import annotations

_JUDGE_SIDE = r'''
MAX_MESSAGE = 8 << 20  # one answer; HumanEval's and MBPP's are a few bytes
STDLIB = getattr(sys, "stdlib_module_names", ("math", "re", "string", "collections", "itertools", "heapq"))
state = {"calls": 0, "checks": 0, "failures": 0, "first_failure": None, "answer_dependent": False}


class Verdict(Exception):
    """Ends the judging: verdict ("failed", "timeout") and a detail."""


class Channel:
    def __init__(self, out_fd, in_fd, deadline):
        self.out_fd, self.in_fd, self.deadline, self.buffer = out_fd, in_fd, deadline, bytearray()
        os.set_blocking(out_fd, False)  # never block past the deadline: select, then read or write what is ready
        os.set_blocking(in_fd, False)

    def wait(self, fd, writing):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Verdict("timeout", "the solution did not answer before the deadline")
        select.select([] if writing else [fd], [fd] if writing else [], [], left)

    def send(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        while data:
            try:
                data = data[os.write(self.out_fd, data):]
            except BlockingIOError:
                self.wait(self.out_fd, True)
            except OSError:
                raise Verdict("failed", "the solution's process is gone") from None

    def recv(self):
        while b"\n" not in self.buffer:
            self.wait(self.in_fd, False)
            try:
                chunk = os.read(self.in_fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise Verdict("failed", "the solution's process ended or closed its channel before answering")
            self.buffer.extend(chunk)
            if len(self.buffer) > MAX_MESSAGE:
                raise Verdict("failed", "the solution sent an oversized answer")
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer[:] = rest
        message = json.loads(line)
        if type(message) is not dict:
            raise Verdict("failed", "the solution sent a malformed answer")
        return message


class CandidateRaised(RuntimeError):
    pass


# Raised by a call, these would not signal an error to the tests but steer them: map, filter, zip, iter(f, end),
# next(it, default), a generator's for loop and list() read StopIteration as "no more items" (and async iteration
# StopAsyncIteration), so `all(map(f, xs))` would hold for an f that only raises. They become CandidateRaised, a
# RuntimeError, as PEP 479 turns a StopIteration leaving a generator into one. Warnings are no error to re-raise.
# The builtin errors that protocols also catch (IndexError ends the old __getitem__ iteration, AttributeError is
# hasattr's or getattr's default, KeyError reaches __missing__) do so only in methods the tests' own classes
# define, and a test that expects one (`except IndexError`) needs it kept: they stay what they are. Exceptions
# that are not Exception (SystemExit, KeyboardInterrupt, GeneratorExit) are CandidateRaised already.
NOT_RERAISED = (StopIteration, StopAsyncIteration, Warning)  # and every BaseException that is no Exception


class Proxy:
    """Stands for a function of the solution: the call runs in the sandbox, the answer comes back as plain data."""

    def __init__(self, channel, name):
        self.channel, self.name = channel, name

    def __call__(self, *args, **kwargs):
        self.channel.send({"call": self.name, "args": enc(list(args)), "kwargs": enc(dict(kwargs))})
        answer = self.channel.recv()
        state["calls"] += 1
        if set(answer) == {"value"}:
            return dec(answer["value"])
        if set(answer) == {"raised", "message"} and type(answer["raised"]) is str:
            kind = getattr(builtins, answer["raised"], None)
            if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, NOT_RERAISED):
                raise kind(str(answer["message"]))
            raise CandidateRaised(str(answer["message"]))
        raise Verdict("failed", "the solution sent a malformed answer")


def _category(x):
    t = type(x)
    if t is bool:
        return "bool"
    if t in (int, float, complex):
        return "number"
    for kind in (str, bytes, list, tuple, dict, type(None)):
        if isinstance(x, kind):
            return kind.__name__
    if isinstance(x, (set, frozenset)):
        return "set"
    return "other"


def _tag(x):
    """A hashable stand-in for a set element or dict key that keeps bool apart from the numbers equal to it
    (True == 1, so {True} == {1} and {True: 0} == {1: 0} in Python): tagged by _category, recursively through
    tuples and frozensets; equal numbers of the number kind keep one tag (1 and 1.0, as == has them)."""
    kind = _category(x)
    if kind == "tuple":
        return (kind, tuple(_tag(v) for v in x))
    if kind == "set":
        return (kind, frozenset(_tag(v) for v in x))
    return (kind, x)


def strict_eq(a, b):
    """== with types: bool equals only bool, numbers compare by value, containers by kind and element; set
    elements and dict keys by their _tag (so bool stays bool in them too), then dict values by strict_eq."""
    kind = _category(a)
    if kind != _category(b):
        return False
    if kind in ("list", "tuple"):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b))
    if kind == "set":
        return len(a) == len(b) and {_tag(x) for x in a} == {_tag(y) for y in b}
    if kind == "dict":
        if len(a) != len(b):
            return False
        keys_b = {_tag(k): k for k in b}
        if {_tag(k) for k in a} != keys_b.keys():
            return False
        return all(strict_eq(a[k], b[keys_b[_tag(k)]]) for k in a)
    return bool(a == b)


def failed(message):
    """A check that did not hold: recorded, and the tests go on (see Strict)."""
    state["failures"] += 1
    if state["first_failure"] is None:
        state["first_failure"] = message[:400]


def checked(value, where):
    if value:
        state["checks"] += 1
    else:
        failed("assert at %s failed" % where)


def errored(exc, where):
    """An exception in a guarded statement (the solution raised, or its answer broke the test's own code): a
    failure, recorded; the judge's own verdicts (deadline, channel) still end the judging."""
    if isinstance(exc, Verdict):
        raise exc
    try:
        failed("%s at %s: %s" % (type(exc).__name__, where, exc))
    except BaseException:
        failed("%s at %s" % (type(exc).__name__, where))


def _evaluated(thunks):
    results = []
    for thunk in thunks:
        try:
            results.append((True, thunk()))
        except Verdict:
            raise
        except BaseException as exc:
            results.append((False, exc))
    return results


def eager_and(*thunks):
    """`a and b`, every operand evaluated first (so every call is made), then combined as `and` would."""
    value = None
    for ok, value in _evaluated(thunks):
        if not ok:
            raise value
        if not value:
            return value
    return value


def eager_or(*thunks):
    value = None
    for ok, value in _evaluated(thunks):
        if not ok:
            raise value
        if value:
            return value
    return value


def eager_if(test, body, orelse):
    """`body if test else orelse`, all three evaluated first."""
    (ok_t, t), (ok_b, b), (ok_o, o) = _evaluated((test, body, orelse))
    if not ok_t:
        raise t
    if t:
        if not ok_b:
            raise b
        return b
    if not ok_o:
        raise o
    return o


def eager_all(iterable):
    return all(list(iterable))


def eager_any(iterable):
    return any(list(iterable))


def caught(thunk, where):
    """A comprehension's element that calls the solution: an exception is recorded, the iteration goes on."""
    try:
        return thunk()
    except BaseException as exc:
        errored(exc, where)
        return None


SIMPLE = (ast.Assert, ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)
GUARDED = SIMPLE + (ast.If, ast.For, ast.While, ast.With)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _thunk(expr):
    return ast.Lambda(ast.arguments([], [], None, [], [], None, []), expr)


def _calls_any(node, callers):
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in callers for n in ast.walk(node))


class Hoist(ast.NodeTransformer):
    """Each call to the solution in a statement, innermost first and in source order, becomes its own guarded
    statement `__ps_vN = candidate(...)`, so that an exception elsewhere in the statement (`tuple(None)` on a
    wrong answer, HumanEval/33) cannot skip a later call; lambdas and comprehensions keep theirs (their own scope)."""

    def __init__(self, callers, counter):
        self.callers, self.counter, self.hoisted = callers, counter, []

    def visit_Lambda(self, node):
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in self.callers:
            self.counter[0] += 1
            name = "__ps_v%d" % self.counter[0]
            self.hoisted.append(ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], node), node))
            return ast.copy_location(ast.Name(name, ast.Load()), node)
        return node


class Strict(ast.NodeTransformer):
    """The calls the solution receives never depend on its answers (no oracle of which answer was right):
    - assert T, M  ->  __ps_checked(T, where), which records a failure instead of raising, and `a == b` in T ->
      __ps_eq(a, b) (immune to python -O);
    - every statement that calls anything (an assert, `x = candidate(...)`, an expression, an if, a loop) runs
      guarded: an exception (the solution raised, or its wrong answer broke the test's own code) is recorded as a
      failure and the tests go on with the next statement, in the same order as for a right solution; each call to
      the solution in a simple statement is made first, guarded on its own (Hoist); inside a `try` the test's own
      handlers keep their meaning and nothing is guarded or hoisted;
    - `and`, `or` and `x if c else y` evaluate every operand first, then combine as Python would; all() and
      any() consume their whole argument first; a comprehension's element that calls the solution records its
      exception and the iteration goes on.
    The verdict is unchanged: passed only if no check failed and nothing raised."""

    def __init__(self, callers):
        self.in_try, self.callers, self.counter = 0, set(callers), [0]

    def _statements(self, nodes):
        done = []
        for node in nodes:
            node = self.visit(node)
            done.extend(node if isinstance(node, list) else [node])
        return done

    def visit_Try(self, node):
        self.in_try += 1
        node.body = self._statements(node.body)
        self.in_try -= 1
        node.handlers = [self.visit(n) for n in node.handlers]
        node.orelse = self._statements(node.orelse)
        node.finalbody = self._statements(node.finalbody)
        # The try as a whole is guarded: what its handlers do not catch is recorded and the tests go on.
        return node if self.in_try else self._guard(node)

    visit_TryStar = visit_Try

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        name = "__ps_and" if isinstance(node.op, ast.And) else "__ps_or"
        return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), [_thunk(v) for v in node.values], []), node)

    def visit_IfExp(self, node):
        self.generic_visit(node)
        thunks = [_thunk(v) for v in (node.test, node.body, node.orelse)]
        return ast.copy_location(ast.Call(ast.Name("__ps_if", ast.Load()), thunks, []), node)

    def _comprehension(self, node):
        self.generic_visit(node)
        if self.in_try:
            return node
        where = ast.Constant("line %d" % node.lineno)
        for field in ("elt", "key", "value"):
            part = getattr(node, field, None)
            if part is not None and _calls_any(part, self.callers):
                call = ast.Call(ast.Name("__ps_caught", ast.Load()), [_thunk(part), where], [])
                setattr(node, field, ast.copy_location(call, part))
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Assert(self, node):
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            test = ast.Call(ast.Name("__ps_eq", ast.Load()), [test.left, test.comparators[0]], [])
        test = self.visit(test)
        where = ast.Constant("line %d" % node.lineno)
        call = ast.Call(ast.Name("__ps_checked", ast.Load()), [test, where], [])
        return self._guard(ast.copy_location(ast.Expr(call), node))

    def _guard(self, node):
        if self.in_try or not any(isinstance(n, ast.Call) for n in ast.walk(node)):
            return node
        statements = [node]
        if isinstance(node, SIMPLE):
            hoist = Hoist(self.callers, self.counter)
            node = hoist.visit(node)
            statements = hoist.hoisted + [node]
        where = ast.Constant("line %d" % node.lineno)
        guarded = []
        for statement in statements:
            handler = ast.ExceptHandler(
                ast.Name("BaseException", ast.Load()),
                "__ps_exc",
                [ast.Expr(ast.Call(ast.Name("__ps_errored", ast.Load()), [ast.Name("__ps_exc", ast.Load()), where], []))],
            )
            guarded.append(ast.copy_location(ast.Try([statement], [handler], [], []), statement))
        return guarded

    def generic_visit(self, node):
        node = super().generic_visit(node)
        if isinstance(node, GUARDED) and not isinstance(node, ast.Assert):
            return self._guard(node)
        return node


# Statements that may call the solution: Strict guards each one and Hoist makes each of its calls first, on its own.
CALLING_STATEMENTS = (ast.Assert, ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)
# Statements that only group others (their conditions must not depend on answers).
GROUPING_STATEMENTS = (ast.For, ast.While, ast.If, ast.With)
# Names that never call anything back, and statements that hold no expression.
INERT_STATEMENTS = (ast.Import, ast.ImportFrom, ast.Pass, ast.Break, ast.Continue, ast.Global, ast.Nonlocal)
# A generator expression that calls the solution is consumed whole only as the one argument of these: all() and
# any() are the judge's eager_all/eager_any (list() first), list() and tuple() never look at an element. Any other
# consumer (sum, set, sorted, next, str.join, ...) may stop at the first element that breaks it.
EAGER_CONSUMERS = ("all", "any", "list", "tuple")
COMPREHENSION_NODES = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
TRY_NODES = (ast.Try, getattr(ast, "TryStar", ast.Try))


def answer_dependent(tree, proxies):
    """None when every call the tests make to the solution is made whatever its earlier answers, else why not
    (a clause naming the line). An allowlist of shapes, not a search for bad ones: a call to the solution may stand
    only in an assert, an expression statement or an assignment, in the body of the module, of `check`, or of a
    for/while/if/with whose condition does not use an answer (Strict guards each statement, Hoist makes each call
    first); its arguments use no answer; inside a comprehension only in the element of a list (or the value of a
    dict) comprehension, one call per element, over an iteration that uses no answer, or in a generator consumed
    whole (EAGER_CONSUMERS). Anything else calls it, or not, depending on what it answered, and is refused: the
    solution's name passed as a value (map, filter, sorted(key=...), functools.reduce, itertools.takewhile), a
    lambda or a function of the tests that calls it, a try around more than one call, a set element or a dict
    key (an unhashable answer ends the comprehension), two calls in one element (the first one's exception skips
    the second), a condition or an iteration over an answer. A try may hold one call, as a statement of its body
    after nothing that uses an answer (its handlers call nothing; what they bind counts as an answer). "Uses an answer": a call to the solution, or a name
    bound from one (assigned, iterated over, or mutated by a method call whose arguments use one), to a fixed
    point, wherever in the tests it happens."""
    callers = set(proxies)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "check":
            callers.update(a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs)
    tainted = set()

    def is_call(n):
        return isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in callers

    def uses(expr):
        return any(is_call(n) or (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in tainted)
                   for n in ast.walk(expr))

    def calls(node):
        return [n for n in ast.walk(node) if is_call(n)]

    def names(target):
        return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}

    for _ in range(50):  # names bound from answers, to a fixed point
        before = len(tainted)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                if uses(node.value):
                    for target in getattr(node, "targets", None) or [node.target]:
                        tainted.update(names(target))
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and uses(node.iter):
                tainted.update(names(node.target))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None and uses(node.context_expr):
                tainted.update(names(node.optional_vars))
            elif isinstance(node, TRY_NODES) and calls(node):  # which of its paths ran depends on the answer
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
                        for target in getattr(inner, "targets", None) or [inner.target]:
                            tainted.update(names(target))
                    elif isinstance(inner, (ast.For, ast.comprehension)):
                        tainted.update(names(inner.target))
                    elif isinstance(inner, ast.ExceptHandler) and inner.name:
                        tainted.add(inner.name)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # xs.append(answer)
                base = node.func.value
                while isinstance(base, (ast.Attribute, ast.Subscript)):
                    base = base.value
                if isinstance(base, ast.Name) and any(uses(a) for a in node.args + [k.value for k in node.keywords]):
                    tainted.add(base.id)
        if len(tainted) == before:
            break

    called = {id(n.func) for n in ast.walk(tree) if is_call(n)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in callers and id(node) not in called:
            return ("line %d uses the solution's function as a value (as map, filter, sorted(key=...) or "
                    "functools.reduce do), so how often it is called is not the tests' to decide" % node.lineno)

    def expression(stmt, parts):
        """Why the calls in `parts` (expressions of one calling statement) might not all be made, or None."""
        parents = {}
        for part in parts:
            for parent in ast.walk(part):
                for child in ast.iter_child_nodes(parent):
                    parents[id(child)] = parent
        for part in parts:
            for call in calls(part):
                line = getattr(call, "lineno", stmt.lineno)
                if any(uses(a) for a in call.args + [k.value for k in call.keywords]):
                    return "line %d passes an answer of the solution (or a call to it) to the solution" % line
                child, parent = call, parents.get(id(call))
                while parent is not None:
                    if isinstance(parent, ast.Lambda):
                        return "line %d calls the solution inside a lambda" % line
                    if isinstance(parent, (ast.Await, ast.Yield, ast.YieldFrom)):
                        return "line %d awaits or yields around a call to the solution" % line
                    if isinstance(parent, ast.comprehension):
                        return "line %d calls the solution in a comprehension's iteration or condition" % line
                    if isinstance(parent, COMPREHENSION_NODES):
                        if isinstance(parent, ast.SetComp) or (isinstance(parent, ast.DictComp) and child is parent.key):
                            return ("line %d calls the solution for a set element or a dict key (an unhashable "
                                    "answer would end the comprehension)" % line)
                        element = parent.value if isinstance(parent, ast.DictComp) else parent.elt
                        if len(calls(element)) > 1:
                            return "line %d calls the solution twice in one element of a comprehension" % line
                        if any(isinstance(n, ast.Name) and n.id in tainted for n in ast.walk(element)):
                            return ("line %d uses an answer in a comprehension's element beside a call to the "
                                    "solution (its exception would skip the call)" % line)
                        if any(uses(c.iter) or any(uses(i) for i in c.ifs) for c in parent.generators):
                            return "line %d iterates over the solution's answers" % line
                        if isinstance(parent, ast.GeneratorExp):
                            consumer = parents.get(id(parent))
                            if not (isinstance(consumer, ast.Call) and isinstance(consumer.func, ast.Name)
                                    and consumer.func.id in EAGER_CONSUMERS and consumer.args == [parent]
                                    and not consumer.keywords):
                                return ("line %d calls the solution in a generator that its consumer may leave "
                                        "before the end" % line)
                    child, parent = parent, parents.get(id(parent))
        return None

    def body(statements, top):
        for stmt in statements:
            why = statement(stmt, top)
            if why:
                return why
        return None

    def statement(stmt, top):
        line = stmt.lineno
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "check" and top:
            if calls(ast.Module(stmt.decorator_list + stmt.args.defaults + stmt.args.kw_defaults, [])):
                return "line %d calls the solution in check's signature" % line
            return body(stmt.body, False)
        if isinstance(stmt, INERT_STATEMENTS):
            return None
        if isinstance(stmt, CALLING_STATEMENTS):
            parts = [stmt.test] if isinstance(stmt, ast.Assert) else [stmt.value] if stmt.value is not None else []
            parts += getattr(stmt, "targets", None) or ([stmt.target] if hasattr(stmt, "target") else [])
            return expression(stmt, parts)
        if isinstance(stmt, GROUPING_STATEMENTS):
            if isinstance(stmt, ast.For):
                head = [stmt.iter, stmt.target]
            elif isinstance(stmt, ast.With):
                head = [item.context_expr for item in stmt.items]
            else:
                head = [stmt.test]
            if any(uses(h) for h in head):
                kind = {ast.For: "a for loop", ast.While: "a while loop", ast.If: "an if", ast.With: "a with"}
                return "line %d: %s whose %s uses the solution's answers" % (
                    line, kind[type(stmt)], "iteration" if isinstance(stmt, ast.For) else "condition")
            return body(stmt.body + getattr(stmt, "orelse", []), False)
        if isinstance(stmt, TRY_NODES) and (calls(stmt) or uses(stmt)):
            # One call, in the try's body, as a calling statement: it is made whatever the answers before it, and
            # nothing after it in the try calls the solution (the handler that runs decides no call). Strict
            # guards the try as a whole; the names it binds count as answers (above).
            inner = [n for part in stmt.body for n in ast.walk(part)]
            calling = [part for part in stmt.body if calls(part)]
            nested = any(isinstance(n, TRY_NODES) for n in inner)
            if len(calls(stmt)) != 1 or len(calling) != 1 or not isinstance(calling[0], CALLING_STATEMENTS) or nested:
                return ("line %d: a try around more than one call to the solution, or a call outside its body (its "
                        "handlers would decide which calls are made)" % line)
            if any(uses(part) for part in stmt.body[: stmt.body.index(calling[0])]):
                return "line %d: a try that uses an answer before its call to the solution" % line
            return statement(calling[0], False)
        if calls(stmt):
            what = "a function of the tests" if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
                "a %s statement" % type(stmt).__name__.lower()
            return "line %d calls the solution from %s" % (line, what)
        return None

    return body(tree.body, True)


def load(channel, source, name, namespace, prelude=None):
    """Compile test code with strict asserts; bind its free names: stdlib modules, else the solution's functions.
    `prelude` (HumanEval's prompt: helpers such as `poly`) runs first when the tests use a name it may define."""
    tree = ast.parse(source, name)
    stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stored.add(node.name)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
        elif isinstance(node, ast.alias):
            stored.add((node.asname or node.name).split(".")[0])
    free = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    free = {n for n in free - stored if n not in namespace and not hasattr(builtins, n)}
    if prelude and free - set(STDLIB):
        saved = dict(namespace)
        exec(compile(prelude, "prompt.py", "exec"), namespace)
        namespace.update(saved)  # the proxies stay: the prompt's stub of the entry point is not the solution
    for free_name in sorted(free):
        if free_name not in namespace:
            # A module the solution imported (MBPP asserts may use it): the judge imports its own copy.
            namespace[free_name] = __import__(free_name) if free_name in STDLIB else Proxy(channel, free_name)
    proxies = {n for n, v in namespace.items() if isinstance(v, Proxy)}
    callers = proxies | {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "check"
                         for a in n.args.args}
    state["answer_dependent"] = state["answer_dependent"] or answer_dependent(tree, proxies) or False
    return compile(ast.fix_missing_locations(Strict(callers).visit(tree)), name, "exec")


def refuse_answer_dependent():
    """Before the first call: tests whose calls may depend on the solution's answers would tell the candidate,
    through the calls it receives, which answer was right, and a channel across runs (the page cache of the
    read-only binds, docs/tasks.md) could carry that to the next run; such a task is not graded at all."""
    if state["answer_dependent"]:
        raise Verdict("failed", "the task's tests branch on the solution's answers (%s), so their calls would tell "
                                "right from wrong; the task is not graded (rewrite its tests as plain asserts)"
                      % state["answer_dependent"])


def judge(task, channel):
    """Run the task's tests against the solution behind `channel`; returns normally only if every check held."""
    hello = channel.recv()
    if "load_error" in hello:
        raise Verdict("failed", "the solution does not load: %s" % hello["load_error"])
    if hello != {"ready": True}:
        raise Verdict("failed", "the solution sent a malformed greeting")
    random.seed(task.get("seed"))  # the tests' random inputs (HumanEval/38, 50, 53): the run's seed
    namespace = {"__name__": "__judge__", "__ps_eq": strict_eq, "__ps_checked": checked, "__ps_errored": errored,
                 "__ps_and": eager_and, "__ps_or": eager_or, "__ps_if": eager_if, "__ps_caught": caught, "all": eager_all,
                 "any": eager_any}
    if task["kind"] == "humaneval":
        namespace[task["entry_point"]] = Proxy(channel, task["entry_point"])  # tests may call it by name
        code = load(channel, task["test"], "test.py", namespace, prelude=task["prompt"])
        refuse_answer_dependent()
        exec(code, namespace)
        namespace["check"](Proxy(channel, task["entry_point"]))
    else:
        exec(compile(task["setup"], "setup.py", "exec"), namespace)
        # All lines at once, and the setup after them (a function it defines may call the solution; the analysis
        # does not depend on the order, and the lines keep their numbers): the shape, no call.
        load(channel, "\n".join(task["tests"] + [task["setup"]]), "tests.py", dict(namespace))
        refuse_answer_dependent()
        for number, line in enumerate(task["tests"], 1):
            exec(load(channel, line, "test_%d.py" % number, namespace), namespace)
    if state["failures"]:
        raise Verdict("failed", "%d check(s) failed, first: %s" % (state["failures"], state["first_failure"]))
    if state["calls"] == 0 or state["checks"] == 0:
        raise Verdict("failed", "the tests made no call to the solution or checked nothing")
'''
