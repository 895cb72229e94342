import Testing

/// Every test of a real device (mounts, the device process, the command
/// line, the service, the bus) runs in a suite nested in this one, and so
/// one at a time, also under a plain `swift test`: each starts processes,
/// mounts and timers of its own, and two at once on a machine of two cores
/// made one miss its timing. Unit tests stay parallel.
@Suite(.serialized) package enum SerialTests {}
