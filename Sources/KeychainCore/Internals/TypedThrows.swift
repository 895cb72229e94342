extension Array {
    /// `withUnsafeBytes` that keeps the body's typed error (the standard
    /// library's only rethrows `any Error`).
    package func withBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try withUnsafeBytes { raw in Result { () throws(E) in try body(raw) } }.get()
    }

    /// `withUnsafeMutableBytes` that keeps the body's typed error.
    package mutating func withMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R)
        throws(E) -> R
    {
        try withUnsafeMutableBytes { raw in Result { () throws(E) in try body(raw) } }.get()
    }
}
