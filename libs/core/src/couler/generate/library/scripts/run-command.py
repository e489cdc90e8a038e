"""Run a command-line tool as a step (dbt, spark-submit, feast, a vendor CLI): the command
runs as written, without a shell, in the step's image; its exit status is the step's."""
from _common import fail, out_dir, parser

p = parser(__doc__, consumes=("data",), produces=("data",), optional=("data",))
p.add_argument("--command", required=True,
               help="the command line, e.g. \"dbt build --select payments\" (split like a shell "
                    "would, but never run by one)")
p.add_argument("--workdir", default="", help="the directory to run in (default: the input data)")
p.add_argument("--timeout", default="0", help="seconds before the command is stopped (0: none)")
args = p.parse_args()

import os
import shlex
import shutil
import subprocess

try:
    argv = shlex.split(args.command)
except ValueError as e:
    fail(f"--command {args.command!r}: {e}")
if not argv:
    fail("--command: empty")
if shutil.which(argv[0]) is None:
    fail(f"--command: {argv[0]!r} is not installed in this image (run the step in an image "
         "that has it)")
out = out_dir(args.out_data)
env = {**os.environ, "COULER_OUT_DATA": str(out)}
if args.in_data:
    env["COULER_IN_DATA"] = args.in_data
cwd = args.workdir or args.in_data or None
timeout = float(args.timeout) or None
try:
    done = subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, check=False)
except subprocess.TimeoutExpired:
    fail(f"--command {argv[0]}: still running after {args.timeout} s")
if done.returncode:
    fail(f"--command {argv[0]}: exit status {done.returncode}", code=done.returncode)
print(f"{argv[0]}: done")
