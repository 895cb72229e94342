#if canImport(Glibc)
import Glibc
#endif

/// A file that only root can change: root's, writable by nobody else, in
/// directories that are root's and writable by nobody else. What decides
/// who gets a secret (the pinentry that answers for the person) and what
/// names a program for good (its Debian package) must be such a file: any
/// other one a program of the user could replace.
package enum RootControlledFile {
    /// The file's status when root controls it and it is a regular file.
    /// With `stickyDirectories`, a directory that others may write but
    /// whose sticky bit keeps them from renaming or removing root's entries
    /// (/tmp) counts as root's too (POSIX, S_ISVTX on directories).
    package static func status(of path: String, stickyDirectories: Bool = false) -> stat? {
        guard path.hasPrefix("/") else { return nil }
        var info = stat()
        guard stat(path, &info) == 0, info.st_uid == 0, info.st_mode & 0o022 == 0, info.st_mode & S_IFMT == S_IFREG
        else {
            return nil
        }
        var directory = path
        while let slash = directory.lastIndex(of: "/") {
            directory = slash == directory.startIndex ? "/" : String(directory[..<slash])
            var parent = stat()
            guard stat(directory, &parent) == 0, parent.st_uid == 0,
                parent.st_mode & 0o022 == 0 || (stickyDirectories && parent.st_mode & S_ISVTX != 0)
            else { return nil }
            if directory == "/" { break }
        }
        return info
    }

    /// The file a symbolic link at `path` names, resolved whole, when root
    /// controls the link: it lies in directories that are root's and
    /// writable by nobody else, so no program of a user can point it
    /// elsewhere (Debian's `/usr/bin/pytest-3 -> pytest`); nil otherwise.
    package static func linkTarget(ofRootsLink path: String) -> String? {
        guard path.hasPrefix("/") else { return nil }
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFLNK else { return nil }
        var directory = path
        while let slash = directory.lastIndex(of: "/") {
            directory = slash == directory.startIndex ? "/" : String(directory[..<slash])
            var parent = stat()
            guard stat(directory, &parent) == 0, parent.st_uid == 0, parent.st_mode & 0o022 == 0 else { return nil }
            if directory == "/" { break }
        }
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// Whether root controls `path` (sticky directories allowed) and it is executable.
    package static func isExecutable(_ path: String) -> Bool {
        guard let info = status(of: path, stickyDirectories: true) else { return false }
        return info.st_mode & 0o111 != 0
    }
}
