#!/usr/bin/python3
# Something between a client and its TPM, for the tests: tpm2-tss's `cmd`
# TCTI runs this program and writes each TPM command to its standard input,
# expecting the response on its standard output. Commands go to the
# software TPM at 127.0.0.1:PORT (its raw command channel), except:
#
#   busy PORT CODE[,CODE...]      commands whose code is listed (hex, e.g. 15e
#                                 for Unseal) get TPM_RC_RETRY (TPM 2.0 Part 2,
#                                 6.6.3: "the TPM was not able to start the
#                                 command") without reaching the TPM;
#   log PORT LOG                  every command goes to the TPM, and its code is
#                                 appended to LOG, one hex number a line;
#   substitute PORT OTHER LOG     TPM2_CreatePrimary (0x131) and TPM2_ReadPublic
#                                 (0x173, which reads the persistent storage key)
#                                 go to the TPM at OTHER, whose storage key is
#                                 then the one the client would salt its session
#                                 with (a key whose private part an interposer
#                                 would hold), and the code of every command is
#                                 appended to LOG, one hex number a line.
import socket
import struct
import sys

RETRY = 0x922
CREATE_PRIMARY = 0x131
READ_PUBLIC = 0x173
mode, port = sys.argv[1], int(sys.argv[2])
tpm = socket.create_connection(("127.0.0.1", port))
busy, other, log = set(), None, None
if mode == "busy":
    busy = {int(code, 16) for code in sys.argv[3].split(",")}
elif mode == "log":
    log = open(sys.argv[3], "a")
else:
    other = socket.create_connection(("127.0.0.1", int(sys.argv[3])))
    log = open(sys.argv[4], "a")


def read_exactly(stream, count):
    data = b""
    while len(data) < count:
        chunk = stream.read(count - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


def respond(connection):
    replies = connection.makefile("rb", buffering=0)
    header = read_exactly(replies, 10)
    size = struct.unpack(">I", header[2:6])[0]
    return header + read_exactly(replies, size - 10)


stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
while True:
    header = read_exactly(stdin, 10)
    tag, size, code = struct.unpack(">HII", header)
    command = header + read_exactly(stdin, size - 10)
    if log:
        log.write("%x\n" % code)
        log.flush()
    if code in busy:
        stdout.write(struct.pack(">HII", 0x8001, 10, RETRY))
    else:
        target = other if other and code in (CREATE_PRIMARY, READ_PUBLIC) else tpm
        target.sendall(command)
        stdout.write(respond(target))
    stdout.flush()
