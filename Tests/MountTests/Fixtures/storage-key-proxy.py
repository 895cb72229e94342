#!/usr/bin/python3
# Something in between a machine and its TPM (issue 38): tpm2-tss's `cmd`
# TCTI runs this program and writes each TPM command to its standard input,
# expecting the response on its standard output. TPM2_CreatePrimary (0x131)
# goes to another TPM, whose storage key is then the one the client salts
# its session with (a key whose private part the interposer would hold);
# every other command goes to the machine's TPM. The code of every command
# is appended to LOG, one hex number a line, so a test sees what was sent.
# Usage: storage-key-proxy.py TPM_PORT OTHER_TPM_PORT LOG
import socket
import struct
import sys

tpm = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
other = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
log = open(sys.argv[3], "a")
CREATE_PRIMARY = 0x131


def read_exactly(stream, count):
    data = b""
    while len(data) < count:
        chunk = stream.read(count - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


def receive(connection, count):
    data = b""
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            sys.exit(1)
        data += chunk
    return data


def respond(connection):
    header = receive(connection, 10)
    size = struct.unpack(">I", header[2:6])[0]
    return header + receive(connection, size - 10)


stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
while True:
    header = read_exactly(stdin, 10)
    tag, size, code = struct.unpack(">HII", header)
    command = header + read_exactly(stdin, size - 10)
    log.write("%x\n" % code)
    log.flush()
    target = other if code == CREATE_PRIMARY else tpm
    target.sendall(command)
    stdout.write(respond(target))
    stdout.flush()
