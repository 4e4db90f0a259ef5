// Translation unit that builds the shared precompiled header (see cmake/UlyssesHelpers.cmake).
