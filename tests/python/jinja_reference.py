"""Chat templates rendered by Jinja itself, as Hugging Face's apply_chat_template renders them
(transformers' chat template utilities): an immutable sandbox with trim_blocks, lstrip_blocks and
loop controls; raise_exception; strftime_now; tojson as json.dumps with ensure_ascii=False. Written
from those documented settings, not from warmpool's interpreter.

    python3 jinja_reference.py CASES.json  ->  a JSON list of {"name", "output"} or {"name", "error"}
"""

import json
import sys
from datetime import datetime

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    results = []
    for case in json.load(open(sys.argv[1])):
        try:
            output = env.from_string(case["template"]).render(**case["context"])
            results.append({"name": case["name"], "output": output})
        except Exception as error:  # noqa: BLE001 - every failure is the case's answer
            results.append({"name": case["name"], "error": f"{type(error).__name__}: {error}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
