// Anchors the precompiled ATen header (see worker/CMakeLists.txt).
