# Attack programs against a keychainfs service, speaking its socket protocol
# (docs/PROTOCOL.md) as any local program can.
import ctypes, os, resource, select, socket, struct, sys, threading, time

# The device protocol's version: the test writes the build's own in its copy.
PROTOCOL_VERSION = 0

def field(data):
    return struct.pack('<I', len(data)) + data

def frame(kind, fields):
    body = bytes([PROTOCOL_VERSION, kind]) + struct.pack('<i', 0) + b''.join(fields)
    return struct.pack('<I', len(body)) + body

def answer(raw):
    if len(raw) < 10:
        return 'no reply'
    body = raw[4:]
    kind, code, rest, fields = body[1], struct.unpack('<i', body[2:6])[0], body[6:], []
    while len(rest) >= 4:
        n = struct.unpack('<I', rest[:4])[0]
        fields.append(rest[4:4 + n].decode(errors='replace'))
        rest = rest[4 + n:]
    return '%d %d %s' % (kind, code, ' '.join(fields))

def ask(path, kind, fields, descriptor=None):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    data = frame(kind, fields)
    if descriptor is None:
        s.sendall(data)
    else:
        socket.send_fds(s, [data], [descriptor])
    raw = b''
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return answer(raw)
        raw += chunk

def attach(path, descriptor, mountpoint='/nonexistent'):
    return ask(path, 24, [b'\x00' + field(b''), field(mountpoint.encode())], descriptor)

def not_a_mount(kind):
    if kind == 'socketpair':
        return socket.socketpair()[1].detach()
    if kind == 'pipe':
        return os.pipe()[0]
    if kind == 'file':
        return os.open('/etc/hostname', os.O_RDONLY)
    if kind == 'devnull':
        return os.open('/dev/null', os.O_RDWR)
    if kind == 'unmounted-fuse':
        return os.open('/dev/fuse', os.O_RDWR)
    if kind == 'directory':
        return os.open('/', os.O_RDONLY)
    if kind == 'eventfd':
        return os.eventfd(0)
    raise SystemExit('unknown kind ' + kind)

def slow_sender(path, interval, report):
    # One byte of a request every `interval` seconds, for as long as the
    # service lets the connection live; reports how long that was.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    request, started = frame(1, []), time.monotonic()
    try:
        for byte in request[:-1]:
            s.send(bytes([byte]))
            readable, _, _ = select.select([s], [], [], interval)
            if readable:
                break
        while not select.select([s], [], [], 1)[0]:
            pass
    except OSError:
        pass
    report['slow'] = time.monotonic() - started

def flood(path, count, hold, ready):
    # `count` idle connections, held `hold` seconds; reports how many the
    # service took, refused at once, and cut.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    report, connections = {}, []
    slow = threading.Thread(target=slow_sender, args=(path, 2.5, report))
    slow.start()
    time.sleep(0.2)
    for _ in range(count):
        # A blocking connect waits for room in the listener's backlog.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            connections.append(s)
        except OSError:
            s.close()
    open(ready, 'w').close()
    time.sleep(hold)
    refused = cut = 0
    for s in connections:
        waiting = select.poll()
        waiting.register(s, select.POLLIN)
        if waiting.poll(0):
            try:
                data = s.recv(4096)
            except OSError:
                data = b''
            if b'too many connections' in data or b'try again' in data:
                refused += 1
            else:
                cut += 1
        s.close()
    slow.join()
    print('connected %d refused %d cut %d slow %.1f' % (len(connections), refused, cut, report.get('slow', -1)))

def large_stall(path, count, announced, sent, hold, ready):
    # `count` connections, each announcing a body of `announced` bytes and
    # sending `sent` of them, then nothing for `hold` seconds; reports how
    # many were refused at once (an answer before the body was whole) and
    # the first refusal's words.
    connections, refused, said = [], 0, ''
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        try:
            s.sendall(struct.pack('<I', announced) + bytes(sent))
        except OSError:
            pass  # refused before all of it was read: the answer says so
        connections.append(s)
    time.sleep(0.5)  # a refusal comes as soon as the header is read
    for s in connections:
        waiting = select.poll()
        waiting.register(s, select.POLLIN)
        if waiting.poll(0):
            refused += 1
            said = said or answer(s.recv(65536))
    open(ready, 'w').close()
    time.sleep(hold)
    for s in connections:
        s.close()
    print('held %d refused %d: %s' % (count - refused, refused, said))

def unread_replies(path, count, request, hold, ready):
    # `count` connections, one after another, each sending the request framed
    # in the file `request` (a get of a large item) and reading nothing of a
    # reply but whether it was a refusal (its first bytes), held `hold` seconds.
    with open(request, 'rb') as f:
        data = f.read()
    connections, refused = [], 0
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(path)
        s.sendall(data)
        waiting = select.poll()
        waiting.register(s, select.POLLIN)
        if waiting.poll(1000) and b'large request' in s.recv(512, socket.MSG_PEEK):
            refused += 1
        connections.append(s)
    open(ready, 'w').close()
    time.sleep(hold)
    for s in connections:
        s.close()
    print('held %d refused %d' % (count - refused, refused))

def attach_many(path, count):
    # `count` attach attempts, each with a descriptor that is no mount.
    answers = {}
    for _ in range(count):
        fd = os.eventfd(0)
        reply = attach(path, fd)
        os.close(fd)
        key = ' '.join(reply.split(' ')[:2])
        answers[key] = answers.get(key, 0) + 1
    print(' '.join('%s:%d' % (k, v) for k, v in sorted(answers.items())))

def main(argv):
    command, path = argv[1], argv[2]
    if command == 'attach':
        # Each kind of descriptor that is not a mounted /dev/fuse.
        for kind in argv[3:]:
            print(kind, attach(path, not_a_mount(kind)))
    elif command == 'attach-allow-other':
        # Run as root: a FUSE mount anyone may enter (allow_other), made for
        # the user UID, who then passes it to the service.
        mountpoint, uid, gid = argv[3], int(argv[4]), int(argv[5])
        fd = os.open('/dev/fuse', os.O_RDWR)
        options = 'fd=%d,rootmode=40000,user_id=%d,group_id=%d,allow_other' % (fd, uid, gid)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b'keychainfs', mountpoint.encode(), b'fuse.keychainfs', 0, options.encode()) != 0:
            raise SystemExit('mount: ' + os.strerror(ctypes.get_errno()))
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        print(attach(path, fd, mountpoint))
    elif command == 'grant':
        # A grant naming a file by its path alone, with the user's own passcode.
        group, executable, passcode = argv[3], argv[4], argv[5]
        none = b'\x00' + field(b'')
        print(ask(path, 20, [field(group.encode()), field(executable.encode()), none, none,
                             b'\x01' + field(passcode.encode()), field(b'0')]))
    elif command == 'flood':
        flood(path, int(argv[3]), float(argv[4]), argv[5])
    elif command == 'large-stall':
        large_stall(path, int(argv[3]), int(argv[4]), int(argv[5]), float(argv[6]), argv[7])
    elif command == 'unread-replies':
        unread_replies(path, int(argv[3]), argv[4], float(argv[5]), argv[6])
    elif command == 'attach-many':
        attach_many(path, int(argv[3]))
    else:
        raise SystemExit('unknown command ' + command)

main(sys.argv)
