"""Operating-system isolation of sandboxed programs. Stdlib only, run by the fork server.

code_zygote.py executes this file's text once at its start (it is never imported by the
package). The work is split so that each program pays only for what is its own:

  server, once: `build_root(work_root, ...)`  the server moves into mount and network
     namespaces of its own (and a user namespace, mapping our uid to 0, when not root)
     and pivots into a new root: read-only binds of the system directories and the
     interpreter's prefix only (no /home, /root, /work: no dataset file is reachable),
     a small /dev, no /proc (no process to see), a read-only /tmp, an empty network
     namespace (no interface up), and the parent's directory of work dirs, the one
     writable place. That directory is not listable and each work dir has an
     unguessable name (as root, also its own uid and mode 0700), so a program reaches
     its own only.
  per program, in the forked child A: `unshare_namespaces(userns)`  new pid and ipc
     namespaces (and a user namespace of its own when not root, so its process count
     is its own); A forks B, the program, and exits.
  in B: `enter(home, userns)`  B is pid 1 of the new pid namespace: when it ends the
     kernel kills every process left in it (a detached child cannot outlive its
     verdict), and its processes cannot see or signal any other program's. It sets
     no_new_privs, empties the capability bounding set (and, in a user namespace, drops
     every capability) and installs the seccomp filter (no sockets, mounts, namespaces,
     ptrace, keys, bpf, io_uring, SysV or POSIX queues).
  A mount per program (a private /tmp, a procfs of its own pid namespace, work dirs
  hidden by a tmpfs) cost up to 40% of the short programs' throughput on two cores;
  none is needed for the separation above.

This is what bubblewrap does, done with the same kernel calls from the already running
interpreter: bubblewrap (or nsjail) would exec a helper and then a fresh interpreter per
program, the ~20 ms of CPU the fork server exists to save. `probe(...)` runs the whole
sequence once in a throwaway child; the server falls back to no namespaces when it fails.
"""

import ctypes
import os

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p)
_LIBC.syscall.restype = ctypes.c_long
_NR = {"x86_64": {"pivot_root": 155, "mount_setattr": 442, "capset": 126},
       "aarch64": {"pivot_root": 41, "mount_setattr": 442, "capset": 91}}.get(
           os.uname().machine, {})
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH, _AT_RECURSIVE, _AT_FDCWD = 2, 0x8000, -100
_ATTR_RDONLY, _ATTR_NOSUID, _ATTR_NODEV = 0x1, 0x2, 0x4
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT = 38, 24, 47
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_DEVICES = ("null", "zero", "full", "random", "urandom")


class _MountAttr(ctypes.Structure):
  _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
              ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result, what):
  if result != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
  _check(_LIBC.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                     flags, data and data.encode()), f"mount {target}")


def _syscall(name, *args):
  if name not in _NR:
    raise OSError(38, f"{name}: no syscall number for {os.uname().machine}")
  return _LIBC.syscall(_NR[name], *args)


PROC_FD = []  # the host's /proc, kept by the server across its pivot (A writes maps there)


def _map_to_root(uid, gid):
  """In a fresh user namespace: our uid as 0 inside (it owns the namespaces it sets up)."""
  for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                     ("gid_map", f"0 {gid} 1")):
    fd = os.open(f"self/{name}" if PROC_FD else f"/proc/self/{name}", os.O_WRONLY,
                 dir_fd=PROC_FD[0] if PROC_FD else None)
    try:
      os.write(fd, text.encode())
    finally:
      os.close(fd)


def unshare_namespaces(userns):
  """In A (the forked child, before it forks B): new namespaces; B is their pid 1."""
  uid, gid = os.geteuid(), os.getegid()
  flags = CLONE_NEWPID | CLONE_NEWIPC
  _check(_LIBC.unshare(flags | (CLONE_NEWUSER if userns else 0)), "unshare")
  if userns:
    _map_to_root(uid, gid)


def _bind(source, target, flags=0):
  if os.path.isdir(source):
    os.makedirs(target, exist_ok=True)
  else:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
  _mount(source, target, None, MS_BIND | MS_REC | flags)


def _read_only(path, devices=False):
  """Adds read-only, nosuid and (unless `devices`, a bound device node) nodev to the
  mount at `path` and, for a directory, those below it."""
  attr = _MountAttr(_ATTR_RDONLY | _ATTR_NOSUID | (0 if devices else _ATTR_NODEV), 0, 0, 0)
  result = _syscall("mount_setattr", _AT_FDCWD, path.encode(),
                    0 if devices else _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
  if result == 0:
    return
  if ctypes.get_errno() != 38:  # ENOSYS: a kernel before 5.12, remount mount by mount
    _check(result, f"mount_setattr {path}")
  st = os.statvfs(path)
  kept = sum(flag for bit, flag in ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NODEV, MS_NODEV))
             if st.f_flag & bit)  # (a user namespace may not drop the locked ones)
  _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | kept)


def build_root(work_root, prefixes, userns):
  """In the server, once: its own mount namespace and the programs' root (docstring)."""
  uid, gid = os.geteuid(), os.getegid()
  # One network namespace with nothing in it for the server and every program (one per
  # program cost a fifth of the throughput); the seccomp filter refuses sockets, so
  # programs cannot meet in it either.
  flags = CLONE_NEWNS | CLONE_NEWNET | (CLONE_NEWUSER if userns else 0)
  _check(_LIBC.unshare(flags), "unshare")
  if userns:
    _map_to_root(uid, gid)
  _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates out
  new = os.path.join(work_root, ".root")  # (shadows nothing the new root shows)
  os.makedirs(new, exist_ok=True)
  _mount("jaxrl_root", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
  read_only, binds, devices = [], [], []
  for path in _SYSTEM_DIRS + tuple(prefixes):
    if (path == "/" or not os.path.lexists(path)
        or any(path == b or path.startswith(b + "/") for b in binds)):
      continue
    if os.path.islink(path) and path in _SYSTEM_DIRS:  # merged /usr: /bin -> usr/bin
      os.symlink(os.readlink(path), new + path)
      continue
    _bind(path, new + path)
    binds.append(path)
    read_only.append(new + path)
  os.makedirs(new + "/dev")
  _mount("jaxrl_dev", new + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
  for name in _DEVICES:
    if os.path.exists("/dev/" + name):
      _bind("/dev/" + name, f"{new}/dev/{name}")
      devices.append(f"{new}/dev/{name}")
  # No /proc at all: none is the cheapest view of no other process (a procfs per program
  # cost a fifth of the throughput). The host's stays open for A's maps (PROC_FD).
  for path in ("/proc", "/tmp", work_root):
    os.makedirs(new + path, exist_ok=True)
  for path in read_only:  # (before the root's own pass: it would make them nodev)
    _read_only(path)
  for path in devices:
    _read_only(path, devices=True)
  _read_only(new + "/dev", devices=True)  # (the tmpfs of the device nodes' binds)
  _read_only(new, devices=True)  # the root's tmpfs (mount points only)
  _mount(work_root, new + work_root, None, MS_BIND)  # (after the pass: stays writable)
  if userns:
    PROC_FD.append(os.open("/proc", os.O_RDONLY | os.O_DIRECTORY))
  os.chdir(new)
  _check(_syscall("pivot_root", b".", b"."), "pivot_root")
  _check(_LIBC.umount2(b".", _MNT_DETACH), "umount old root")  # the old root is gone
  os.chdir("/")


def enter(home, prefixes, no_caps):
  """In B: into its work dir, then no privileges (drop_privileges) and Landlock."""
  os.chdir(home)
  drop_privileges(no_caps)
  landlock(home, prefixes)


def drop_privileges(no_caps):
  """no_new_privs (setuid files and file capabilities stop elevating), no bounding set,
  the seccomp filter; `no_caps`: no capabilities either (a user namespace's root, or
  root that gets no uid of its own; otherwise the bootstrap's switch to the program's
  uid clears them)."""
  _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
  cap = 0
  while _LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
    cap += 1
  _LIBC.prctl(_PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL (absent before 4.3)
  if no_caps:
    _drop_capabilities()
  install_seccomp()


def _drop_capabilities():
  header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
  data = (ctypes.c_uint32 * 6)()
  _check(_syscall("capset", header, data), "capset")


# Refused with EPERM: what a test program never needs and a way out would (sockets, other
# processes' memory, mounts, namespaces, kernel keys, modules, io_uring, bpf, SysV and
# POSIX message queues, device nodes and fifos). clone with a CLONE_NEW* flag is refused
# too; clone3, whose flags a filter cannot read, answers ENOSYS (glibc then falls back to
# clone). Numbers from the kernel's asm/unistd_64.h and asm-generic/unistd.h.
_REFUSED_SYSCALLS = {
    "x86_64": (0xC000003E, 56, 435, (
        41, 53, 101, 310, 311, 165, 166, 155, 161, 272, 308, 250, 248, 249, 321, 298, 323,
        425, 426, 427, 246, 320, 175, 313, 176, 304, 303, 163, 167, 168, 169, 103, 68, 64,
        29, 240, 430, 431, 432, 433, 428, 429, 442, 133, 259)),
    "aarch64": (0xC00000B7, 220, 435, (
        198, 199, 117, 270, 271, 40, 39, 41, 51, 97, 268, 219, 217, 218, 280, 241, 282,
        425, 426, 427, 104, 294, 105, 273, 106, 265, 264, 89, 224, 225, 142, 116, 186, 190,
        194, 180, 430, 431, 432, 433, 428, 429, 442, 33)),
}
# Signals, refused too where nothing else keeps a program from the judge's processes (no
# namespaces, our own uid): kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo,
# pidfd_send_signal.
_SIGNAL_SYSCALLS = {"x86_64": (62, 200, 234, 129, 297, 424),
                    "aarch64": (129, 130, 131, 138, 240, 424)}
_CLONE_NEW_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | ...


class _SockFilter(ctypes.Structure):
  _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
              ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp_program(signals):
  """The BPF program of the filter (`signals`: refuse those too), or None on an
  architecture without a table."""
  if os.uname().machine not in _REFUSED_SYSCALLS:
    return None
  arch, clone, clone3, refused = _REFUSED_SYSCALLS[os.uname().machine]
  if signals:
    refused += _SIGNAL_SYSCALLS[os.uname().machine]
  ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  kill, allow, eperm, enosys = 0x80000000, 0x7FFF0000, 0x00050001, 0x00050026
  code = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
  tail = [(ret, 0, 0, allow), (ret, 0, 0, eperm), (ret, 0, 0, enosys),
          (ld, 0, 0, 16), (jset, 0, 0, _CLONE_NEW_FLAGS), (ret, 0, 0, eperm),
          (ret, 0, 0, allow)]
  checks = [("eperm", 0x40000000, jge)] if arch == 0xC000003E else []  # (x32 numbers)
  checks += [("eperm", nr, jeq) for nr in refused]
  checks += [("enosys", clone3, jeq), ("clone", clone, jeq)]
  start = len(code) + len(checks)  # index of tail[0]
  where = {"eperm": start + 1, "enosys": start + 2, "clone": start + 3}
  for target, k, op in checks:
    code.append((op, where[target] - (len(code) + 1), 0, k))
  tail[4] = (jset, 0, 1, _CLONE_NEW_FLAGS)  # set: EPERM next; else skip to allow
  code += tail
  return (_SockFilter * len(code))(*[_SockFilter(*c) for c in code])


_FILTERS = {False: _seccomp_program(False), True: _seccomp_program(True)}


def install_seccomp(signals=False):
  """Installs the filter (needs no_new_privs first); False where the kernel has none."""
  program = _FILTERS[signals]
  if program is None:
    return False
  prog = _SockFprog(len(program), ctypes.cast(program, ctypes.POINTER(_SockFilter)))
  return _LIBC.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0  # PR_SET_SECCOMP, MODE_FILTER


def confine(home, prefixes, signals, no_caps):
  """Without namespaces: no_new_privs, the seccomp filter (`signals`: refusing signals
  too), Landlock, and (`no_caps`: root that gets no uid of its own) no capabilities."""
  _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  if no_caps:
    _drop_capabilities()
  install_seccomp(signals)
  landlock(home, prefixes)


# Landlock (Linux 5.13+, unprivileged): writes only beneath the work dir, reads and execs
# only beneath the system directories and the interpreter's prefix. Without namespaces it
# is the filesystem boundary (no dataset, no other program's files, no escape through a
# dir_fd); with them, a second one.
_LANDLOCK_ABI = _LIBC.syscall(444, None, 0, 1)  # landlock_create_ruleset(VERSION)
_LL_EXECUTE, _LL_WRITE, _LL_READ, _LL_READ_DIR = 1, 2, 4, 8
_LL_REFER, _LL_TRUNCATE = 1 << 13, 1 << 14


class _PathBeneath(ctypes.Structure):
  _pack_ = 1
  _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


LANDLOCK = [_LANDLOCK_ABI >= 1]  # (probe_landlock's verdict: off where it fails here)


def probe_landlock(home, prefixes):
  """Whether the rules can be applied here: once, in a throwaway child."""
  if not LANDLOCK[0]:
    return False
  pid = os.fork()
  if pid == 0:
    try:
      _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
      landlock(home, prefixes)
      os._exit(0)
    finally:
      os._exit(1)
  LANDLOCK[0] = os.waitpid(pid, 0)[1] == 0
  return LANDLOCK[0]


def landlock(home, prefixes):
  """Restricts this process (and what it starts) as above; False where the kernel cannot."""
  if not LANDLOCK[0]:
    return False
  handled = ((1 << 13) - 1 | (_LL_REFER if _LANDLOCK_ABI >= 2 else 0)
             | (_LL_TRUNCATE if _LANDLOCK_ABI >= 3 else 0))
  attr = ctypes.c_uint64(handled)
  ruleset = _LIBC.syscall(444, ctypes.byref(attr), ctypes.sizeof(attr), 0)
  _check(0 if ruleset >= 0 else -1, "landlock_create_ruleset")
  file_rights = _LL_EXECUTE | _LL_WRITE | _LL_READ | (handled & _LL_TRUNCATE)
  rules = [(home, handled)] + [(path, _LL_EXECUTE | _LL_READ | _LL_READ_DIR)
                               for path in _SYSTEM_DIRS + tuple(prefixes)]
  rules += [("/dev/" + name, (_LL_READ | _LL_WRITE | (handled & _LL_TRUNCATE)))
            for name in _DEVICES]
  try:
    for path, rights in rules:
      try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
      except OSError:
        continue  # (absent here)
      try:
        if not os.path.isdir(path):
          rights &= file_rights
        rule = _PathBeneath(rights, fd)
        _check(0 if _LIBC.syscall(445, ruleset, 1, ctypes.byref(rule), 0) == 0 else -1,
               f"landlock_add_rule {path}")
      finally:
        os.close(fd)
    _check(0 if _LIBC.syscall(446, ruleset, 0) == 0 else -1, "landlock_restrict_self")
  finally:
    os.close(ruleset)
  return True


def probe_seccomp():
  """Whether the filter holds here: a throwaway child confined, then refused a socket."""
  pid = os.fork()
  if pid == 0:
    try:
      _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
      install_seccomp()
      refused = _LIBC.socket(1, 1, 0) < 0 and ctypes.get_errno() == 1  # AF_UNIX, EPERM
      os._exit(0 if refused else 1)
    finally:
      os._exit(1)
  return os.waitpid(pid, 0)[1] == 0


def probe(work_root, prefixes, userns):
  """Runs the whole isolation in a throwaway child: None when it works, else why not."""
  home = os.path.join(work_root, "probe")
  os.mkdir(home)
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      os.close(read)
      build_root(work_root, prefixes, userns)
      os.chdir(home)
      unshare_namespaces(userns)
      inner = os.fork()
      if inner == 0:
        try:
          enter(home, prefixes, userns)
          if os.path.exists("/proc/1") or os.path.exists(f"/proc/{os.getppid()}"):
            raise OSError("other processes are visible")
          os._exit(0)
        except BaseException as e:  # pylint: disable=broad-except
          os.write(write, str(e).encode()[:300])
          os._exit(1)
      _, status = os.waitpid(inner, 0)
      os._exit(0 if status == 0 else 1)
    except BaseException as e:  # pylint: disable=broad-except
      os.write(write, str(e).encode()[:300])
      os._exit(1)
  os.close(write)
  why = b""
  while chunk := os.read(read, 4096):
    why += chunk
  os.close(read)
  _, status = os.waitpid(pid, 0)
  os.rmdir(home)
  return None if status == 0 else (why.decode("utf-8", "replace") or f"status {status}")
