#!/usr/bin/env python3
"""The shipped alert rules on the metrics files of the fleet scenario's real runs.

    fleet-alerts.py RULES GOOD.prom FAILED.prom OUT_DIR

Writes promtool test files into OUT_DIR and runs `promtool test rules` on them, as
tests/it/packaging.rs does for runs on the CI machine: each file's samples become
promtool's input_series as a Prometheus scraping node_exporter's textfile collector sees
them (the `instance` and `job` labels the scrape adds), scraped every minute while the
collector keeps exposing the file. The good run: no alert at 10 minutes, none stale at
13 days. The failed run: ReseqRunFailed not yet at 2 minutes (its `for: 5m`), firing at
10 minutes with the run's exit code in its summary. Then a control: the same test
expecting the good run to fire must fail, or promtool compared nothing.
Exit 0 when all of that holds; the reason on stderr otherwise.
"""
import re
import subprocess
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def unescape(v):
    return re.sub(r'\\(.)', lambda m: '\n' if m.group(1) == 'n' else m.group(1), v)


def samples(path):
    out = []
    for line in open(path, encoding='utf-8'):
        line = line.rstrip('\n')
        if not line or line.startswith('#'):
            continue
        m = SAMPLE.match(line)
        if not m:
            sys.exit(f'{path}: not a sample: {line}')
        labels = [(k, unescape(v)) for k, v in LABEL.findall(m.group(2) or '')]
        out.append((m.group(1), labels, float(m.group(3))))
    if not out:
        sys.exit(f'{path}: no samples')
    return out


def q(s):
    return "'" + s.replace("'", "''") + "'"


def series_value(name, value, finished):
    # promtool's clock starts at 0: the run ended at time 0.
    return value - finished if name == 'reseq_last_run_timestamp_seconds' else value


def test_group(host, interval, steps, checks):
    instance, smp = host
    finished = next(v for n, _, v in smp if n == 'reseq_last_run_timestamp_seconds')
    labels = smp[0][1] + [('instance', instance), ('job', 'node')]
    sel = ','.join('{}="{}"'.format(k, v.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n'))
                   for k, v in labels)
    y = f'  - interval: {interval}\n    input_series:\n'
    for name, _, value in smp:
        v = series_value(name, value, finished)
        y += f"      - series: {q(name + '{' + sel + '}')}\n        values: '{v!r}+0x{steps}'\n"
    y += '    alert_rule_test:\n'
    for at, alert, summary in checks:
        y += f'      - eval_time: {at}\n        alertname: {alert}\n'
        if summary is None:
            y += '        exp_alerts: []\n'
            continue
        y += '        exp_alerts:\n          - exp_labels:\n'
        for k, v in labels:
            y += f'              {k}: {q(v)}\n'
        y += f'            exp_annotations:\n              summary: {q(summary)}\n'
    return y


def promtool(path):
    r = subprocess.run(['promtool', 'test', 'rules', path], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    rules, good_path, failed_path, out = sys.argv[1:5]
    good = ('vm-good:9100', samples(good_path))
    failed = ('vm-failed:9100', samples(failed_path))
    by_name = {n: v for n, _, v in failed[1]}
    code = by_name.get('reseq_last_run_exit_code')
    if code is None or code == 0:
        sys.exit(f'{failed_path}: the failed run says exit code {code}')
    if {n: v for n, _, v in good[1]}.get('reseq_last_run_exit_code') != 0:
        sys.exit(f'{good_path}: the good run does not say exit code 0')
    # The metrics the rules name that a run without --bench writes: a misspelt one would
    # leave its alert silent for ever, and "silent" would prove nothing.
    text = open(rules, encoding='utf-8').read()
    for name in sorted(set(re.findall(r'reseq_[a-z_]+', text)) - {'reseq_last_run_measurable_change'}):
        for path, (_, smp) in ((good_path, good), (failed_path, failed)):
            if not any(n == name for n, _, _ in smp):
                sys.exit(f'the alert rules use {name}, which {path} does not have')

    def target(host):
        return dict(host[1][0][1])['target']

    fired = f'reseq on {failed[0]} ({target(failed)}) failed with exit code {code:g}'
    silent = [(at, a, None) for at in ('10m',) for a in ('ReseqRunFailed', 'ReseqRunStale', 'ReseqNoMeasurableChange')]
    head = f'rule_files:\n  - {q(rules)}\nevaluation_interval: 1m\ntests:\n'
    test = (head
            + test_group(good, '1m', 30, silent)
            + test_group(good, '1d', 16, [('13d', 'ReseqRunStale', None)])
            + test_group(failed, '1m', 30, [('2m', 'ReseqRunFailed', None), ('10m', 'ReseqRunFailed', fired),
                                            ('10m', 'ReseqRunStale', None)]))
    path = f'{out}/alerts-test.yml'
    open(path, 'w', encoding='utf-8').write(test)
    rc, text = promtool(path)
    if rc != 0:
        sys.exit(f'promtool test rules {path} exited {rc}:\n{text}')
    print(f'promtool test rules: the good run silent, the failed run fires: "{fired}"')
    # The control: the good run taken for a failed one must fail the test.
    wrong = f'reseq on {good[0]} ({target(good)}) failed with exit code 0'
    control = head + test_group(good, '1m', 30, [('10m', 'ReseqRunFailed', wrong)])
    path = f'{out}/alerts-control.yml'
    open(path, 'w', encoding='utf-8').write(control)
    rc, text = promtool(path)
    if rc != 1:
        sys.exit(f'promtool passed a test that must fail ({path}, exit {rc}):\n{text}')
    print('promtool test rules: the control (the good run expected to fire) fails, as it must')


if __name__ == '__main__':
    main()
