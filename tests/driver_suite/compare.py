#!/usr/bin/env python3
"""Compare two runs of a driver's test suite: straight to PostgreSQL ("direct")
and through pgcarpool ("pgcarpool").

    compare.py DIRECT PGCARPOOL KNOWN [--out SUMMARY.txt] [--markdown TABLE.md]

DIRECT and PGCARPOOL are result files: a pytest JUnit XML (--junitxml) or, when the run
was cut short and wrote no XML, its verbose (-v -rA) log; or the output of `go test -json`
(*.json; tests are named PACKAGE::TestName/subtest, PACKAGE relative to the module).
KNOWN lists known differences: one test id per line, '#' starts a comment (the reason),
blank lines are ignored.

Prints per-run counts and every test that passed directly but failed or errored through
pgcarpool, with the first line of its failure. Exit status: 0, or 1 when a difference is
not listed in KNOWN (the caller decides whether that matters), 2 on unusable input.
"""

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET

OUTCOMES = ("passed", "failed", "error", "skipped")


def junit_id(case):
    """pytest's node id from a JUnit testcase: tests/test_pool.py::TestPool::test_x."""
    classname = case.get("classname", "")
    name = case.get("name", "")
    parts = classname.split(".")
    # classname is "tests.test_pool.TestPool" (or "tests.test_pool" for a function).
    for i in range(len(parts), 0, -1):
        if parts[i - 1].startswith("test_") or parts[i - 1].startswith("test__"):
            module = "/".join(parts[:i]) + ".py"
            rest = parts[i:]
            return "::".join([module] + rest + [name])
    return "::".join([p for p in (classname, name) if p])


def first_line(text):
    """The most telling line of a failure: the exception line if there is one."""
    if not text:
        return ""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    # pytest's message attribute is usually "ExcType: message"; a traceback text has the
    # exception as its last "E   " line or last line.
    e_lines = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    if e_lines:
        for ln in e_lines:
            if re.match(r"^[\w.]+(Error|Exception|Timeout|Failure)\b", ln) or ":" in ln:
                return ln[:300]
        return e_lines[0][:300]
    return lines[0][:300]


def read_junit(path):
    results = {}
    tree = ET.parse(path)
    for case in tree.iter("testcase"):
        tid = junit_id(case)
        outcome, msg = "passed", ""
        for child in case:
            tag = child.tag
            if tag in ("failure", "error"):
                text = child.get("message") or child.text or ""
                # A teardown error after a failure: keep the failure.
                if outcome in ("failed", "error"):
                    continue
                outcome = "failed" if tag == "failure" else "error"
                msg = first_line(text) or first_line(child.text or "")
            elif tag == "skipped":
                if outcome == "passed":
                    outcome = "skipped"
                    msg = first_line(child.get("message") or child.text or "")
        # pytest writes a second <testcase> for a teardown error of a passed test.
        prev = results.get(tid)
        if prev and prev[0] in ("failed", "error") and outcome == "passed":
            continue
        results[tid] = (outcome, msg)
    return results


VERBOSE_RE = re.compile(
    r"^(?P<id>\S+::\S+) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
SUMMARY_RE = re.compile(
    r"^(?P<outcome>PASSED|FAILED|ERROR|SKIPPED) (?P<id>\S+::\S+)(?: - (?P<msg>.*))?$")


def read_log(path):
    """Fallback for a run that was killed before writing its XML: the -v lines."""
    results = {}
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = SUMMARY_RE.match(line)
            if m:
                out = m.group("outcome").lower()
                results[m.group("id")] = (out, (m.group("msg") or "")[:300])
                continue
            m = VERBOSE_RE.match(line)
            if m:
                out = m.group("outcome").lower()
                out = {"xfail": "skipped", "xpass": "passed"}.get(out, out)
                tid = m.group("id")
                if tid not in results or results[tid][0] == "passed":
                    results[tid] = (out, results.get(tid, (None, ""))[1])
    return results


def go_message(lines):
    """The most telling line of a Go test's output: testify's "Error:" and what follows,
    else the first file:line report."""
    text = [ln.rstrip() for ln in lines if ln.strip()]
    for i, ln in enumerate(text):
        if "Error:" in ln and "Error Trace:" not in ln:
            rest = ln.split("Error:", 1)[1].strip()
            nxt = text[i + 1].strip() if i + 1 < len(text) else ""
            if nxt and not nxt.startswith(("Test:", "Messages:")):
                rest = f"{rest} {nxt}".strip()
            return rest[:300]
    for ln in text:
        s = ln.strip()
        if re.match(r"^\S+\.go:\d+: ", s) or s.startswith("panic:"):
            return s[:300]
    return text[0].strip()[:300] if text else ""


def read_gojson(path):
    """`go test -json` events: a test's outcome is its pass/fail/skip event. A test with
    subtests counts through its subtests; a package that failed outside any test (a build
    failure, a panic, a -timeout) is one entry PACKAGE::(package) with the test that was
    running, which never gets an outcome of its own."""
    import json
    results, output = {}, {}
    pkg_fail = {}
    with open(path, errors="replace") as f:
        for line in f:
            if not line.startswith("{"):
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            pkg, test, action = ev.get("Package", ""), ev.get("Test"), ev.get("Action")
            key = (pkg, test)
            if action == "output":
                output.setdefault(key, []).append(ev.get("Output", ""))
            elif action in ("pass", "fail", "skip") and test:
                out = {"pass": "passed", "fail": "failed", "skip": "skipped"}[action]
                msg = go_message(output.get(key, [])) if out != "passed" else ""
                results[(pkg, test)] = (out, msg)
            elif action == "fail" and not test:
                pkg_fail[pkg] = go_message(output.get(key, []))
    # The module path: the shortest package path is a prefix of the others in pgx.
    pkgs = {p for p, _ in results} | set(pkg_fail)
    root = min(pkgs, key=len) if pkgs else ""

    def rel(p):
        return "." if p == root else p[len(root) + 1:] if p.startswith(root + "/") else p

    final = {}
    for (pkg, test), res in results.items():
        prefix = test + "/"
        children = [t for (p, t) in results if p == pkg and t.startswith(prefix)]
        if children and not (res[0] == "failed" and all(
                results[(pkg, t)][0] != "failed" for t in children)):
            continue
        final[f"{rel(pkg)}::{test}"] = res
    for pkg, msg in pkg_fail.items():
        if not any(p == pkg and r[0] == "failed" for (p, _), r in results.items()):
            final[f"{rel(pkg)}::(package)"] = ("error", msg)
    return final


def read_results(path):
    if path.endswith(".json"):
        return read_gojson(path)
    if path.endswith(".xml"):
        return read_junit(path)
    return read_log(path)


def read_known(path):
    known = {}
    if not path or not os.path.exists(path):
        return known
    with open(path) as f:
        block = []  # a comment block directly above ids is their shared reason
        in_ids = False
        for raw in f:
            line = raw.strip()
            if not line:
                block, in_ids = [], False
                continue
            if line.startswith("#"):
                if in_ids:
                    block, in_ids = [], False
                block.append(line.lstrip("#").strip())
                continue
            in_ids = True
            tid, _, comment = line.partition("#")
            known[tid.strip()] = comment.strip() or " ".join(block)
    return known


def counts(results):
    c = {k: 0 for k in OUTCOMES}
    for outcome, _ in results.values():
        c[outcome] = c.get(outcome, 0) + 1
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("direct")
    ap.add_argument("pooled")
    ap.add_argument("known")
    ap.add_argument("--out")
    ap.add_argument("--markdown")
    args = ap.parse_args()

    try:
        direct = read_results(args.direct)
        pooled = read_results(args.pooled)
    except (OSError, ET.ParseError) as e:
        print(f"compare.py: cannot read results: {e}", file=sys.stderr)
        return 2
    if not direct or not pooled:
        print("compare.py: a run has no test results", file=sys.stderr)
        return 2
    known = read_known(args.known)

    out = []
    p = out.append
    cd, cp = counts(direct), counts(pooled)
    p("counts (passed / failed / errors / skipped / total):")
    for name, c, res in (("direct", cd, direct), ("pgcarpool", cp, pooled)):
        p(f"  {name:<10} {c['passed']:>4} passed  {c['failed']:>3} failed  "
          f"{c['error']:>3} errors  {c['skipped']:>4} skipped  {len(res):>4} total")

    regressions = []
    for tid in sorted(direct):
        if direct[tid][0] != "passed":
            continue
        if tid not in pooled:
            regressions.append((tid, "missing", "not run through pgcarpool"))
        elif pooled[tid][0] in ("failed", "error"):
            regressions.append((tid, pooled[tid][0], pooled[tid][1]))
    improvements = sorted(t for t in pooled
                          if pooled[t][0] == "passed" and t in direct
                          and direct[t][0] in ("failed", "error"))
    # Known differences that ran in both runs and did not differ this time.
    stale = sorted(t for t in known if t in direct and t in pooled
                   and t not in {r[0] for r in regressions})

    unknown = [r for r in regressions if r[0] not in known]
    p("")
    p(f"passed directly, failed through pgcarpool: {len(regressions)} "
      f"({len(regressions) - len(unknown)} known, {len(unknown)} new)")
    for tid, outcome, msg in regressions:
        tag = "known" if tid in known else "NEW  "
        p(f"  [{tag}] {tid}  ({outcome})")
        if msg:
            p(f"          {msg}")
        if tid in known and known[tid]:
            why = known[tid]
            p(f"          known: {why if len(why) <= 160 else why[:157] + '...'}")
    if improvements:
        p("")
        p(f"failed directly, passed through pgcarpool: {len(improvements)}")
        for tid in improvements:
            p(f"  {tid}")
    if stale:
        p("")
        p(f"listed in {os.path.basename(args.known)} but not differing in this run: "
          f"{len(stale)}")
        for tid in stale:
            p(f"  {tid}")

    text = "\n".join(out)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("| run | passed | failed | errors | skipped | total |\n")
            f.write("|---|---:|---:|---:|---:|---:|\n")
            for name, c, res in (("direct", cd, direct), ("pgcarpool", cp, pooled)):
                f.write(f"| {name} | {c['passed']} | {c['failed']} | {c['error']} | "
                        f"{c['skipped']} | {len(res)} |\n")
            f.write("\n| test | through pgcarpool | reason |\n|---|---|---|\n")
            for tid, outcome, msg in regressions:
                why = known.get(tid, "") or "(not yet diagnosed)"
                msg = msg.replace("|", "\\|")
                f.write(f"| `{tid}` | {outcome}: {msg} | {why} |\n")
    return 1 if unknown else 0


if __name__ == "__main__":
    sys.exit(main())
