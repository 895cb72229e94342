import KeychainCore
extension PasswordManager {
    /// The device's lock and settings, answered alike at every door: the
    /// socket, and `.control`, whose lines parse into these requests and
    /// nothing else (docs/FILESYSTEM.md, "`.control`"). The lock and unlock
    /// are the device's own to record, with `subject` as who asked;
    /// `status` builds the status as the door shows it (its mount's group).
    package func answer(
        _ request: DeviceStateRequest, by subject: () -> AuditSubject?, status: (_ mountpoint: String?) -> DeviceStatus
    ) throws(KeychainError) -> any DeviceResult {
        let device = localDevice
        switch request {
        case .lock:
            device.lock(by: subject())
        case .unlock(let passcode):
            try device.unlock(passcode: passcode, by: subject())
        case .status(let mountpoint):
            return status(mountpoint)
        case .sync:
            try sync()
        case .changePasscode(let old, let new):
            try device.changePasscode(from: old, to: new)
        case .autoLock(let after, let grace):
            if after != nil || grace != nil {
                device.setAutoLock(after: after ?? device.autoLock.after, grace: grace ?? device.autoLock.grace)
            }
            return AutoLockSetting(after: device.autoLock.after, grace: device.autoLock.grace)
        case .purge:
            purge()
        case .background:
            background()
        case .accessMode(let mode):
            accessMode = mode
        case .migrate(let migrate):
            self.migrate = migrate
        }
        return Done()
    }
}
