/// Status and report lines: text that may hold a user's path, escaped so
/// that it always stays on one line (`\n`, `\t`, `\\`, other control
/// characters as `\xHH`). ``unescaped(_:)`` reverses it.
public enum LineEscaping {
    /// `text` with backslashes and control characters escaped, and the
    /// characters of `also` as `\xHH` (a separator of the caller's format).
    public static func escaped(_ text: String, also separators: String = "") -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case _
            where scalar.value < 0x20 || (0x7f...0x9f).contains(scalar.value)
                || separators.unicodeScalars.contains(scalar):
                let hex = String(scalar.value, radix: 16)
                out += "\\x" + (hex.count < 2 ? "0" : "") + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// `text` as ``escaped(_:also:)`` writes it, for a person to read: also
    /// every character that would hide or reorder text (Unicode's format
    /// characters such as U+202E, separators other than the space such as
    /// U+2028, private use, unassigned) as `\u{X}`. One way only: for a
    /// terminal, never for a file that is read back (docs/SECRET-SERVICE.md,
    /// "Whose an item is").
    public static func shown(_ text: String, also separators: String = "") -> String {
        var out = ""
        for scalar in escaped(text, also: separators).unicodeScalars {
            if hidesText(scalar) {
                out += "\\u{" + String(scalar.value, radix: 16) + "}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// Whether a person could not see `scalar` for what it is: Unicode's
    /// categories C (controls, formats such as U+202E, surrogates, private
    /// use, unassigned) and Z but the space (U+2028 and U+2029 break lines
    /// in GTK and Qt). What ``shown(_:also:)`` and a consent question escape.
    package static func hidesText(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .format, .surrogate, .privateUse, .unassigned, .lineSeparator, .paragraphSeparator: true
        case .spaceSeparator: scalar != " "
        default: false
        }
    }

    /// The text ``escaped(_:)`` was given; nil for a malformed escape.
    public static func unescaped(_ text: String) -> String? {
        var out = String.UnicodeScalarView()
        var scalars = text.unicodeScalars.makeIterator()
        while let scalar = scalars.next() {
            guard scalar == "\\" else { out.append(scalar); continue }
            switch scalars.next() {
            case "\\": out.append("\\")
            case "n": out.append("\n")
            case "t": out.append("\t")
            case "x":
                guard let high = scalars.next(), let low = scalars.next(),
                    let value = UInt32(String(high) + String(low), radix: 16),
                    let decoded = Unicode.Scalar(value)
                else { return nil }
                out.append(decoded)
            default: return nil
            }
        }
        return String(out)
    }
}

extension String {
    /// This text as one word of a shell command line: as it is when every
    /// character is one a shell takes literally, else in single quotes (a
    /// quote inside as `'\''`). For the commands a message suggests: a name
    /// with a space printed bare would be two words when pasted.
    package var shellWord: String {
        let literal = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./%@:+,=-")
        if !isEmpty, allSatisfy({ literal.contains($0) }) { return self }
        var quoted = "'"
        for character in self { quoted += character == "'" ? "'\\''" : String(character) }
        return quoted + "'"
    }
}
