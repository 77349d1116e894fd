"""The judge side of the supervisor (an embedded program): the bounded channel to the candidate, proxies for the
solution's functions, strict comparison and the rewriting of every assert into a counted check."""

from __future__ import annotations

_JUDGE_SIDE = r'''
MAX_MESSAGE = 8 << 20  # one answer; HumanEval's and MBPP's are a few bytes
STDLIB = getattr(sys, "stdlib_module_names", ("math", "re", "string", "collections", "itertools", "heapq"))
state = {"calls": 0, "checks": 0}


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
            if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, Warning):
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


def strict_eq(a, b):
    """== with types: bool equals only bool, numbers compare by value, containers by kind and element."""
    kind = _category(a)
    if kind != _category(b):
        return False
    if kind in ("list", "tuple"):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b))
    if kind == "dict":
        return a.keys() == b.keys() and all(strict_eq(a[k], b[k]) for k in a)
    return bool(a == b)


def checked(value, where):
    if not value:
        raise AssertionError("assert at %s failed" % where)
    state["checks"] += 1


class Strict(ast.NodeTransformer):
    """assert T, M  ->  __ps_checked(T, where), and `a == b` in T -> __ps_eq(a, b); immune to python -O."""

    def visit_Assert(self, node):
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            test = ast.Call(ast.Name("__ps_eq", ast.Load()), [test.left, test.comparators[0]], [])
        where = ast.Constant("line %d" % node.lineno)
        call = ast.Call(ast.Name("__ps_checked", ast.Load()), [test, where], [])
        return ast.copy_location(ast.Expr(call), node)


def load(channel, source, name, namespace, prelude=None):
    """Compile test code with strict asserts; bind its free names: stdlib modules, else the solution's functions.
    `prelude` (HumanEval's prompt: helpers such as `poly`) runs first when the tests use a name it may define."""
    tree = ast.fix_missing_locations(Strict().visit(ast.parse(source, name)))
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
    return compile(tree, name, "exec")


def judge(task, channel):
    """Run the task's tests against the solution behind `channel`; returns normally only if every check held."""
    hello = channel.recv()
    if "load_error" in hello:
        raise Verdict("failed", "the solution does not load: %s" % hello["load_error"])
    if hello != {"ready": True}:
        raise Verdict("failed", "the solution sent a malformed greeting")
    namespace = {"__name__": "__judge__", "__ps_eq": strict_eq, "__ps_checked": checked}
    if task["kind"] == "humaneval":
        namespace[task["entry_point"]] = Proxy(channel, task["entry_point"])  # tests may call it by name
        exec(load(channel, task["test"], "test.py", namespace, prelude=task["prompt"]), namespace)
        namespace["check"](Proxy(channel, task["entry_point"]))
    else:
        exec(compile(task["setup"], "setup.py", "exec"), namespace)
        for number, line in enumerate(task["tests"], 1):
            exec(load(channel, line, "test_%d.py" % number, namespace), namespace)
    if state["calls"] == 0 or state["checks"] == 0:
        raise Verdict("failed", "the tests made no call to the solution or checked nothing")
'''
